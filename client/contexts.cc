#include "client/contexts.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainerd::client {
namespace {

// The keys of a context, with the field each fills.
std::vector<std::pair<const char*, std::string ClientContext::*>> ContextFields() {
  return {{"name", &ClientContext::name},
          {"address", &ClientContext::address},
          {"token-file", &ClientContext::token_file},
          {"tls-ca", &ClientContext::tls_ca},
          {"tls-cert", &ClientContext::tls_cert},
          {"tls-key", &ClientContext::tls_key},
          {"tls-server-name", &ClientContext::tls_server_name}};
}

absl::Status Malformed(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("config file '", path, "': ", why));
}

}  // namespace

const ClientContext* ClientConfig::Find(const std::string& name) const {
  for (const ClientContext& context : contexts) {
    if (context.name == name) return &context;
  }
  return nullptr;
}

ClientContext* ClientConfig::Find(const std::string& name) {
  return const_cast<ClientContext*>(static_cast<const ClientConfig*>(this)->Find(name));
}

std::string ConfigPath(const char* trainctl_config, const char* xdg_config_home, const char* home) {
  if (trainctl_config != nullptr && *trainctl_config != '\0') return trainctl_config;
  if (xdg_config_home != nullptr && *xdg_config_home != '\0') {
    return absl::StrCat(xdg_config_home, "/trainctl/config.yaml");
  }
  return absl::StrCat(home == nullptr ? "" : home, "/.config/trainctl/config.yaml");
}

absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path) {
  ClientConfig config;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return config;
  // Checked before it is read: the file is small by nature, whatever else sits at the path.
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > (1 << 20)) return Malformed(path, "larger than 1 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read config file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1 << 20)) return Malformed(path, "larger than 1 MiB");
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return Malformed(path, e.what());
  }
  if (root.IsNull()) return config;
  if (!root.IsMap()) return Malformed(path, "not a mapping of current-context and contexts");
  try {
    for (const auto& entry : root) {
      const std::string key = entry.first.as<std::string>();
      if (key == "current-context") {
        config.current_context = entry.second.IsNull() ? "" : entry.second.as<std::string>();
      } else if (key == "contexts") {
        if (entry.second.IsNull()) continue;
        if (!entry.second.IsSequence()) return Malformed(path, "contexts is not a list");
        for (const YAML::Node& item : entry.second) {
          if (!item.IsMap()) return Malformed(path, "a context is not a mapping");
          ClientContext context;
          for (const auto& field : item) {
            const std::string name = field.first.as<std::string>();
            bool known = false;
            for (const auto& [key_name, member] : ContextFields()) {
              if (name != key_name) continue;
              known = true;
              if (!field.second.IsNull()) {
                if (!field.second.IsScalar()) {
                  return Malformed(path, absl::StrCat("'", name, "' is not a string"));
                }
                context.*member = field.second.as<std::string>();
              }
            }
            if (!known) {
              return Malformed(path, absl::StrCat("unknown key '", name, "' in a context"));
            }
          }
          if (context.name.empty()) return Malformed(path, "a context has no name");
          if (config.Find(context.name) != nullptr) {
            return Malformed(path, absl::StrCat("context '", context.name, "' appears twice"));
          }
          config.contexts.push_back(std::move(context));
        }
      } else {
        return Malformed(path, absl::StrCat("unknown key '", key, "'"));
      }
    }
  } catch (const YAML::Exception& e) {
    return Malformed(path, e.what());
  }
  return config;
}

absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "current-context" << YAML::Value << config.current_context;
  out << YAML::Key << "contexts" << YAML::Value << YAML::BeginSeq;
  for (const ClientContext& context : config.contexts) {
    out << YAML::BeginMap;
    for (const auto& [key, member] : ContextFields()) {
      if (!(context.*member).empty()) out << YAML::Key << key << YAML::Value << context.*member;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  if (!out.good()) {
    return absl::InternalError(absl::StrCat("cannot write the config: ", out.GetLastError()));
  }
  const std::filesystem::path file(path);
  std::error_code ec;
  if (file.has_parent_path() && !std::filesystem::exists(file.parent_path(), ec)) {
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create '", file.parent_path().string(), "': ", ec.message()));
    }
    ::chmod(file.parent_path().c_str(), 0700);
  }
  const std::string temporary = path + ".tmp";
  {
    // Created 0600 before anything is written into it.
    std::FILE* f = std::fopen(temporary.c_str(), "w");
    if (f == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write '", temporary, "'"));
    }
    ::fchmod(fileno(f), 0600);
    const std::string text = absl::StrCat(
        "# trainctl's contexts: edit with `trainctl config set-context` and `use-context`.\n",
        out.c_str(), "\n");
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) {
      std::remove(temporary.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write '", temporary, "'"));
    }
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::remove(temporary.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot replace '", path, "': ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status ApplyContext(const ClientConfig& config, const std::string& config_path,
                          GlobalOptions& global) {
  const ClientContext* context = nullptr;
  if (!global.context.empty()) {
    context = config.Find(global.context);
    if (context == nullptr) {
      return absl::NotFoundError(absl::StrCat("no context '", global.context, "' in ", config_path,
                                              " (see trainctl config get-contexts)"));
    }
  } else if (!config.current_context.empty() && !global.address_given && !global.address_from_env) {
    context = config.Find(config.current_context);
    if (context == nullptr) {
      return absl::NotFoundError(absl::StrCat("the current context '", config.current_context,
                                              "' is not in ", config_path,
                                              " (see trainctl config use-context)"));
    }
  }
  if (context == nullptr) return absl::OkStatus();
  if (!global.address_given && !context->address.empty()) global.address = context->address;
  const auto fill = [](std::string& field, const std::string& value) {
    if (field.empty()) field = value;
  };
  fill(global.token_file, context->token_file);
  fill(global.tls_ca, context->tls_ca);
  fill(global.tls_cert, context->tls_cert);
  fill(global.tls_key, context->tls_key);
  fill(global.tls_server_name, context->tls_server_name);
  return absl::OkStatus();
}

}  // namespace trainerd::client
