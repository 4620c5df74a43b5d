// trainctl's contexts, as kubectl has them: named sets of an address and credentials in a config
// file, one of them current, so that one trainctl talks to many trainerd nodes.
//
//   # $XDG_CONFIG_HOME/trainctl/config.yaml (written by `trainctl config set-context`)
//   current-context: gpu1
//   contexts:
//     - name: gpu1
//       address: gpu-node-1:50051
//       token-file: /home/me/.config/trainctl/gpu1.token
//       tls-ca: /home/me/.config/trainctl/ca.pem
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli.h"

namespace trainerd::client {

struct ClientContext {
  std::string name;
  std::string address;  // HOST:PORT or unix:PATH
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
};

struct ClientConfig {
  std::string current_context;  // "" when none is current
  std::vector<ClientContext> contexts;

  // The context called `name`, or null.
  const ClientContext* Find(const std::string& name) const;
  ClientContext* Find(const std::string& name);
};

// Where the config file is: $TRAINCTL_CONFIG, else $XDG_CONFIG_HOME/trainctl/config.yaml, else
// $HOME/.config/trainctl/config.yaml. Each argument is that variable's value, or null when unset.
std::string ConfigPath(const char* trainctl_config, const char* xdg_config_home, const char* home);

// Reads the config file; a file that does not exist is an empty config. INVALID_ARGUMENT naming the
// file for YAML that does not parse or does not have the shape above (unknown keys included, so
// that a misspelt key is not silently ignored); FAILED_PRECONDITION when it cannot be read.
absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path);

// Writes the config file whole (a temporary file renamed over it), mode 0600, creating its folder
// (mode 0700) when needed: it names files that hold credentials.
absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config);

// Fills `global` from a context, as kubectl does: with --context NAME, that context (NOT_FOUND
// naming the file when there is none) supplies the address unless --addr was given, and each
// credential file not given as a flag. Without --context, the current context does the same, but
// only when neither --addr nor $TRAINERD_ADDR chose an address: a context's token is never sent
// to an address that is not the context's.
absl::Status ApplyContext(const ClientConfig& config, const std::string& config_path,
                          GlobalOptions& global);

}  // namespace trainerd::client
