// trainctl's command table, argument parser and usage texts.
#include "client/cli.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainerd::client {
namespace {

// The first words of two-word commands.
constexpr absl::string_view kGroups[] = {"dataset", "job", "config"};

// Width of the name column in the usage texts.
constexpr int kUsageColumn = 28;

std::string UsageHint(const CommandSpec* command) {
  if (command == nullptr) return " (see 'trainctl --help')";
  return absl::StrCat(" (see 'trainctl ", command->path, " --help')");
}

bool IsGroup(absl::string_view word) {
  return std::find(std::begin(kGroups), std::end(kGroups), word) != std::end(kGroups);
}

// The command whose full path (or alias form) is `path`, or null.
const CommandSpec* FindCommand(absl::string_view path) {
  for (const CommandSpec& command : Commands()) {
    if (command.path == path) return &command;
    if (command.alias.empty()) continue;
    absl::string_view prefix = command.path.substr(0, command.path.rfind(' ') + 1);
    if (absl::StrCat(prefix, command.alias) == path) return &command;
  }
  return nullptr;
}

const FlagSpec* FindFlag(const CommandSpec& command, absl::string_view name) {
  for (const FlagSpec& flag : command.flags) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

const FlagSpec* FindShortFlag(const CommandSpec& command, absl::string_view short_name) {
  for (const FlagSpec& flag : command.flags) {
    if (!flag.short_name.empty() && flag.short_name == short_name) return &flag;
  }
  return nullptr;
}

std::string PadRight(std::string text, size_t width) {
  if (text.size() < width)
    text.append(width - text.size(), ' ');
  else
    text.append(2, ' ');
  return text;
}

std::string CommandLine(const CommandSpec& command) {
  std::string line(command.path);
  if (!command.args.empty()) absl::StrAppend(&line, " ", command.args);
  return line;
}

std::string GroupUsage(absl::string_view group) {
  std::string text =
      absl::StrCat("Usage: trainctl ", group, " SUBCOMMAND [ARGS...] [FLAGS]\n\n", "Commands:\n");
  for (const CommandSpec& command : Commands()) {
    if (command.hidden || !absl::StartsWith(command.path, absl::StrCat(group, " "))) continue;
    absl::StrAppend(&text, "  ", PadRight(CommandLine(command), kUsageColumn), command.summary,
                    "\n");
  }
  absl::StrAppend(&text, "\nRun 'trainctl ", group,
                  " SUBCOMMAND --help' for a command's flags,\n'trainctl --help' for the global "
                  "flags.\n");
  return text;
}

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& value) {
  return ParseDurationFlag("--timeout", value);
}

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& value) {
  if (value == "table") return OutputFormat::kTable;
  if (value == "wide") return OutputFormat::kWide;
  if (value == "json") return OutputFormat::kJson;
  if (value == "yaml") return OutputFormat::kYaml;
  if (value == "name") return OutputFormat::kName;
  return absl::InvalidArgumentError(absl::StrCat("unknown output format '", value,
                                                 "' (expected table, wide, json, yaml or name)"));
}

// The command named by the words in argv[first...] that complete `*group` (the group word seen
// so far, if any), skipping flags and the values of the global flags that take one. Null when no
// command word follows; `*group` is set when only a group word does. INVALID_ARGUMENT for an
// unknown command, as without --help.
absl::StatusOr<const CommandSpec*> CommandAfterHelpFlag(const std::vector<std::string>& argv,
                                                        size_t first, bool only_words,
                                                        std::string* group) {
  for (size_t i = first; i < argv.size(); ++i) {
    const std::string& token = argv[i];
    if (!only_words && token == "--") {
      only_words = true;
      continue;
    }
    if (!only_words && token.size() >= 2 && token[0] == '-') {
      // Skip the separate value of a global flag ("--addr HOST"); command flags are not known
      // before the command, and a word after them is taken as a command word.
      const bool takes_value = token == "--addr" || token == "--address" || token == "-o" ||
                               token == "--output" || token == "--timeout" ||
                               token == "--token-file" || token == "--tls-ca" ||
                               token == "--tls-cert" || token == "--tls-key" ||
                               token == "--tls-server-name" || token == "--context";
      if (takes_value) ++i;
      continue;
    }
    if (!group->empty()) {
      const CommandSpec* command = FindCommand(absl::StrCat(*group, " ", token));
      if (command == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown command '", *group, " ", token,
                                                       "' (see 'trainctl ", *group, " --help')"));
      }
      return command;
    }
    if (IsGroup(token)) {
      *group = token;
      continue;
    }
    const CommandSpec* command = FindCommand(token);
    if (command == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", token, "'", UsageHint(nullptr)));
    }
    return command;
  }
  return nullptr;
}

// The flags of `submit`: the JobSpec's fields. `sweep` takes them too (SweepFlags).
std::vector<FlagSpec> SubmitFlags() {
  return {{"dataset", "NAME", "the resident dataset to train on (required)"},
          {"model", "SPEC", "layers, e.g. linear:64,relu,linear:1 (required)"},
          {"torchscript", "FILE",
           "train this TorchScript module (torch.jit.script(m)\n"
           ".save(FILE), at most 64 MiB) instead of --model"},
          {"loss", "LOSS",
           "mse, l1, huber or bce_with_logits (float32 targets\n"
           "shaped like the output), cross_entropy or nll (int64\n"
           "class targets; nll wants log-probabilities) (default mse)"},
          {"huber-delta", "D", "huber: where the loss turns linear, > 0 (default 1)"},
          {"label-smoothing", "S", "cross_entropy: 0 <= S < 1 (default 0)"},
          {"optimizer", "OPT", "sgd, adam, adamw or rmsprop (default sgd)"},
          {"lr", "RATE", "learning rate, > 0; the peak with a schedule (default 0.01)"},
          {"momentum", "M", "sgd and rmsprop momentum, 0 <= M < 1 (default 0)"},
          {"nesterov", "", "sgd: Nesterov momentum (needs --momentum above 0)"},
          {"weight-decay", "W",
           "L2 penalty, >= 0; decoupled for adamw (default 0,\n"
           "adamw 0.01)"},
          {"beta1", "B", "adam and adamw, 0 <= B < 1 (default 0.9)"},
          {"beta2", "B", "adam and adamw, 0 <= B < 1 (default 0.999)"},
          {"eps", "E", "adam, adamw and rmsprop, > 0 (default 1e-8)"},
          {"alpha", "A", "rmsprop smoothing, 0 < A < 1 (default 0.99)"},
          {"schedule", "KIND",
           "learning rate per epoch: constant, step (times --gamma\n"
           "every --step-epochs) or cosine (down to --min-lr)\n"
           "(default constant)"},
          {"step-epochs", "N", "step: epochs between decays, >= 1 (required with step)"},
          {"gamma", "G", "step: decay factor, 0 < G <= 1 (default 0.1)"},
          {"min-lr", "RATE", "cosine: the final rate, 0 <= RATE < --lr (default 0)"},
          {"warmup-epochs", "N",
           "ramp the rate up linearly over the first N epochs,\n"
           "N < --epochs (default 0)"},
          {"clip-grad-norm", "N",
           "scale the gradients down to a global L2 norm of at\n"
           "most N, > 0 (default 0: off)"},
          {"batch-size", "N", "rows per step (default 32)"},
          {"epochs", "N", "passes over the dataset (default 10)"},
          {"validation-fraction", "F",
           "hold out this fraction of the rows (a split fixed by\n"
           "the seed) and report validation loss and, for\n"
           "cross_entropy and nll, accuracy each epoch,\n"
           "0 <= F < 1 (default 0: none)"},
          {"validation-dataset", "NAME",
           "validate on this resident dataset instead (same\n"
           "shapes and target dtype as --dataset)"},
          {"early-stop-patience", "N",
           "stop after N epochs without a better validation loss;\n"
           "needs validation (default 0: off)"},
          {"checkpoint-every", "N",
           "save model and optimizer state every N epochs under\n"
           "the daemon's data folder, 1 <= N <= --epochs\n"
           "(default 0: off)"},
          {"precision", "P",
           "fp32, bf16 or fp16: the forward pass under autocast;\n"
           "fp16 adds loss scaling (default fp32)"},
          {"seed", "S",
           "seed for initialisation and shuffling (default: the\n"
           "daemon picks one and reports it in the job)"},
          {"device", "DEVICE",
           "cpu, cuda, cuda:N or auto: the device the cost model\n"
           "expects to finish first, from Diagnose's figures\n"
           "(default: the daemon's default device)"},
          {"priority", "P",
           "high, normal or low: which queued job its device runs\n"
           "next (FIFO within a priority; default normal)"},
          {"engine", "E",
           "auto, fused or libtorch: how the steps run; auto takes\n"
           "the fused path (small MLPs, no per-operator overhead)\n"
           "when the job qualifies (default auto)"},
          {"max-job-time", "T",
           "a --torchscript job's time limit, in seconds or as a\n"
           "duration (90m): its worker is killed and the job FAILED\n"
           "past it (default: the daemon's --max_job_time, 24h)"},
          {"no-shuffle", "", "keep the rows in order (default: reshuffle every epoch)"},
          {"watch", "", "after submitting, follow the job as 'trainctl job watch' does"}};
}

// The flags of `sweep`: submit's, taken from SubmitFlags so that a flag added to submit reaches
// sweeps too, except that the four swept values take lists (client/requests.h,
// SweepRequestFromFlags) and --torchscript is left out: the members of a sweep share a text
// model, which is what lets the daemon pack them into one.
std::vector<FlagSpec> SweepFlags() {
  std::vector<FlagSpec> flags;
  for (const FlagSpec& flag : SubmitFlags()) {
    if (flag.name == "torchscript") continue;
    if (flag.name == "lr") {
      flags.push_back({"lr", "RATE,...",
                       "learning rates, each > 0, e.g. 0.1,0.03,0.01; the peak\n"
                       "with a schedule (default 0.01)"});
    } else if (flag.name == "momentum") {
      flags.push_back({"momentum", "M,...",
                       "sgd and rmsprop momenta, each 0 <= M < 1, e.g. 0,0.9\n"
                       "(default 0)"});
    } else if (flag.name == "weight-decay") {
      flags.push_back({"weight-decay", "W,...",
                       "L2 penalties, each >= 0; decoupled for adamw\n"
                       "(default 0, adamw 0.01)"});
    } else if (flag.name == "seed") {
      flags.push_back({"seed", "S,...",
                       "seeds, whole numbers >= 0, e.g. 1,2,3 (default: one\n"
                       "seed the daemon picks, the same for every member)"});
    } else if (flag.name == "watch") {
      flags.push_back({"watch", "",
                       "after submitting, show the members sorted by loss,\n"
                       "refreshed until every member ended"});
    } else {
      flags.push_back(flag);
    }
  }
  return flags;
}

}  // namespace

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec>* const kCommands = new std::vector<CommandSpec>{
      {"dataset upload",
       "",
       "NAME FILE",
       /*min_args=*/2,
       /*max_args=*/2,
       "Upload a CSV or .npy file as a dataset",
       "Reads FILE, checks it locally, and uploads it to trainerd as dataset NAME, which stays\n"
       "resident on the daemon's device. FILE is NumPy .npy when its name ends in .npy and CSV\n"
       "otherwise. In a CSV file (and in a 2-D .npy array without --targets) the last\n"
       "--target-columns columns are the targets and the others the features; a CSV header line\n"
       "is skipped. NAME matches [A-Za-z0-9._-]{1,128}.\n"
       "\n"
       "With --targets, the targets keep the file's type: an int64 array uploads int64 class\n"
       "indices, a float array float32 values; --target-dtype overrides it.\n"
       "\n"
       "  trainctl dataset upload iris iris.csv --target-dtype int64\n"
       "  trainctl dataset upload mnist images.npy --targets labels.npy   # int64 labels\n",
       {{"target-columns", "N", "trailing columns that are targets (default 1)"},
        {"target-dtype", "TYPE",
         "float32 (regression, mse) or int64 (class indices,\n"
         "cross_entropy; needs one target column) (default: a\n"
         "--targets .npy file's own, int64 for an int64 array;\n"
         "else float32)"},
        {"targets", "FILE.npy",
         "targets as a separate .npy array with one row per feature row;\n"
         "FILE must then be .npy too"}}},
      {"dataset list",
       "ls",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "List the resident datasets",
       "Lists the datasets, by name.\n",
       {}},
      {"dataset get",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Show one dataset",
       "Shows dataset NAME.\n",
       {}},
      {"dataset rm",
       "delete",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Delete a dataset",
       "Deletes dataset NAME: frees its device memory and removes its file. Fails while a\n"
       "queued or running job uses it.\n",
       {}},
      {"dataset share",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Let other tenants' jobs train on a dataset",
       "Shares dataset NAME with every caller of the daemon: their jobs may train on it and\n"
       "they see it in their lists; only you (its owner) and admins may change or delete it.\n"
       "Kept across restarts. Undo with: trainctl dataset unshare NAME\n",
       {}},
      {"dataset unshare",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Stop sharing a dataset",
       "Only you (its owner) and admins see dataset NAME and train on it again. Jobs already\n"
       "queued on it keep it.\n",
       {}},
      {"submit",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Submit a training job",
       "Queues a training job and prints its id (the whole job with -o json). The model spec is\n"
       "checked here before anything is sent. Layers: linear:N, conv2d:C:K[:stride[:padding]],\n"
       "maxpool2d:K, avgpool2d:K, flatten, dropout:P, batchnorm, layernorm, relu, gelu, tanh,\n"
       "sigmoid, softmax, logsoftmax; the input shape comes from the dataset. Or bring your own\n"
       "model: --torchscript FILE sends a module saved with torch.jit.script(model).save(FILE);\n"
       "its parameters are trained and its forward is checked on the dataset's shape at submit.\n"
       "\n"
       "  trainctl submit --dataset iris --model linear:16,relu,linear:3 --loss cross_entropy \\\n"
       "      --optimizer adam --lr 0.01 --epochs 100 --watch\n"
       "  trainctl submit --dataset iris --model linear:16,relu,linear:3 --loss cross_entropy \\\n"
       "      --optimizer adamw --lr 0.01 --schedule cosine --warmup-epochs 5 --clip-grad-norm 1\n"
       "  trainctl submit --dataset digits --model linear:64,relu,linear:10 --loss cross_entropy "
       "\\\n"
       "      --optimizer adam --epochs 100 --validation-fraction 0.2 --early-stop-patience 5\n"
       "  trainctl submit --dataset digits --torchscript net.pt --loss cross_entropy --watch\n",
       {SubmitFlags()}},
      {"sweep",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Submit a hyperparameter sweep (a job per combination)",
       "Queues one job, a member, per combination of the values given to --lr, --momentum,\n"
       "--weight-decay and --seed, and prints the sweep's id and a table of its members (the\n"
       "daemon's answer with -o json). Each of the four takes a comma-separated list or a single\n"
       "value; members are the product of the lists in order, learning rates outermost and seeds\n"
       "innermost: at most 256 values per list and 256 members in all. Every other flag is\n"
       "submit's and applies to every member. Members that share the model and the dataset train\n"
       "together on the daemon as one packed model ('trainctl job get' shows how many). A sweep\n"
       "trains a --model spec; --torchscript is for submit only.\n"
       "\n"
       "With --watch, a table of the members sorted by loss (lowest first; members without a\n"
       "finished epoch last) is refreshed until every member ended (on a terminal; otherwise it\n"
       "is printed once at the end), then a line counts the outcomes and names the best member.\n"
       "Exits 0 when every member succeeded, 3 when any failed, else 4 when any was cancelled.\n"
       "Ctrl-C stops watching; the members keep running. With -o json, prints each member as it\n"
       "ends; -o name prints the members' ids.\n"
       "\n"
       "  trainctl sweep --dataset iris --model linear:16,relu,linear:3 --loss cross_entropy \\\n"
       "      --lr 0.1,0.03,0.01 --momentum 0,0.9 --seed 1,2,3 --epochs 50 --watch\n"
       "  trainctl sweep --dataset iris --model linear:3 --optimizer adamw --lr 0.01 \\\n"
       "      --weight-decay 0,0.01,0.1 -o json\n",
       {SweepFlags()}},
      {"job list",
       "ls",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "List jobs",
       "Lists the newest jobs (50 unless --limit or --all), the newest last, including jobs from\n"
       "before the daemon's last restart. A note on stderr says when older ones were left out.\n"
       "\n"
       "  trainctl job list --state running\n"
       "  trainctl job list --dataset iris --limit 10\n"
       "  trainctl job list --all -o json > jobs.json\n",
       {{"state", "STATE",
         "only jobs in this state: queued, running, succeeded,\nfailed or cancelled"},
        {"dataset", "NAME", "only jobs on this dataset"},
        {"limit", "N", "at most the newest N jobs, 1..1000 (default 50)"},
        {"all", "", "every job, page by page, oldest first"}}},
      {"job get",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Show one job",
       "Shows job ID: its state, spec, progress, timing and (for small models) the trained\n"
       "parameters; -o json prints every parameter value.\n",
       {}},
      {"job watch",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Follow a job's epochs until it ends",
       "Prints the epochs finished so far, then each epoch as it finishes, then how the job\n"
       "ended. Exits 0 when the job succeeded, 3 when it failed and 4 when it was cancelled\n"
       "(1 when trainerd refused or could not be reached). Ctrl-C stops watching; the job keeps\n"
       "running. With -o json, prints one JSON object per event (-o yaml: one document each).\n",
       {}},
      {"job wait",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Wait until a job ends, as kubectl wait does",
       "Waits until job ID ends and exits 0 when it ended as --for asks (succeeded unless told\n"
       "otherwise; 'ended' takes any end). A job that ended otherwise gives its end's code: 3\n"
       "failed, 4 cancelled, 1 succeeded when a failure or cancellation was awaited. --timeout\n"
       "limits the wait (exit 1 when it runs out; default: no limit, as jobs may train for\n"
       "hours). Prints how the job ended (-o json or yaml: the job; -o name: its id when it\n"
       "ended as awaited).\n"
       "\n"
       "  trainctl job wait job-0123456789ab --timeout 10m && trainctl job model job-0123456789ab "
       "-f m.pt\n"
       "  trainctl job wait job-0123456789ab --for ended -o name\n",
       {{"for", "STATE", "succeeded (default), failed, cancelled or ended"}}},
      {"job cancel",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Cancel a queued or running job",
       "Cancels job ID. A running job stops before its next step.\n",
       {}},
      {"job rm",
       "delete",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Delete a job that ended",
       "Deletes job ID's record, its trained model and its checkpoints from the daemon. Fails\n"
       "while the job is queued or running: cancel it first.\n",
       {}},
      {"job model",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Download a succeeded job's trained model",
       "Downloads the trained model of job ID as a TorchScript archive, which Python loads with\n"
       "torch.jit.load(FILE) and C++ with torch::jit::load(FILE). Its forward takes a float32\n"
       "batch shaped like the dataset's features and returns the model's output, in eval form\n"
       "(dropout off, batchnorm on its running statistics). With --file the file is written\n"
       "whole or not at all; without it the archive goes to standard output, which must then\n"
       "not be a terminal. Only a job that succeeded has a model. -o is the output format, as\n"
       "everywhere: with --file, -o json or yaml describes what was written.\n"
       "\n"
       "  trainctl job model job-0123456789ab -f model.pt\n"
       "  trainctl job model job-0123456789ab > model.pt\n",
       {{"file", "FILE", "where to write the model (default: standard output)", "f"}}},
      {"devices",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "List the daemon's devices and what is on them",
       "Lists every device trainerd can train on: its utilization (the last sample; '-' when it\n"
       "cannot be sampled), memory in use, the datasets resident on it, the job running on it and\n"
       "how many wait. The daemon's default device is marked with '*'. With --all-contexts, asks\n"
       "every context of the config file (every node) in turn; one that cannot be reached is\n"
       "shown with the reason, and the exit status is then 1.\n"
       "\n"
       "  trainctl devices --all-contexts\n",
       {{"all-contexts", "", "every context's daemon, one after another"}}},
      {"config get-contexts",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "List the contexts of the config file",
       "Lists the contexts of trainctl's config file ($TRAINCTL_CONFIG, else\n"
       "$XDG_CONFIG_HOME/trainctl/config.yaml, else ~/.config/trainctl/config.yaml): each a name\n"
       "for a trainerd node's address and credentials. The current one is marked with '*'.\n",
       {}},
      {"config current-context",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Print the current context's name",
       "Prints the name of the current context (exit 1 when none is set).\n",
       {}},
      {"config use-context",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Make a context the current one",
       "Makes context NAME current: commands without --addr or --context then talk to its\n"
       "daemon with its credentials (unless $TRAINERD_ADDR names another address).\n",
       {}},
      {"config set-context",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Create or change a context",
       "Creates context NAME, or changes it, from the global flags given with it: --addr,\n"
       "--token-file, --tls-ca, --tls-cert, --tls-key, --tls-server-name (file paths are kept\n"
       "absolute). The first context made becomes the current one.\n"
       "\n"
       "  trainctl config set-context gpu1 --addr gpu-node-1:50051 --token-file ~/gpu1.token\n",
       {}},
      {"config delete-context",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Remove a context",
       "Removes context NAME from the config file (and as the current one, if it was).\n",
       {}},
      {"top",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Show devices and running jobs, refreshed until Ctrl-C",
       "Shows the devices (as 'trainctl devices') and the progress of the running jobs, and\n"
       "refreshes every --interval seconds until Ctrl-C (which exits 0). On a terminal the screen\n"
       "is redrawn in place; otherwise each refresh follows the previous one after a blank line.\n"
       "With -o json, prints one JSON object per refresh: {\"devices\": [...], \"jobs\": [...]}\n"
       "with the running jobs.\n"
       "\n"
       "  trainctl top --interval 5\n"
       "  trainctl top --iterations 1 > snapshot.txt\n",
       {{"interval", "SECONDS", "time between refreshes, at least 0.1 (default 2)"},
        {"iterations", "N", "refresh N times, then exit 0 (default: until Ctrl-C)"}}},
      {"diagnose",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Measure what each device can do",
       "Runs trainerd's checks on every device: a large float32 matrix product (the peak that\n"
       "'job get' compares a job's FLOP/s with), host-to-device copies from pinned memory, the\n"
       "cost of a kernel launch and of a host synchronisation, and the utilization while the\n"
       "products ran. The first run takes a few seconds; later runs print the cached results\n"
       "unless --refresh is given. The checks share the devices with running jobs, so figures\n"
       "taken on a busy daemon are low. The deadline is 120 s unless --timeout is given.\n",
       {{"refresh", "", "measure again instead of printing cached results"}}},
      {"health",
       "",
       "[SERVICE]",
       /*min_args=*/0,
       /*max_args=*/1,
       "Check that trainerd is serving",
       "Asks trainerd's grpc.health.v1 service about SERVICE (default: the whole server).\n"
       "Prints SERVING and exits 0, or prints the status and exits 1.\n",
       {}},
      {"version",
       "",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "Show trainctl's and trainerd's versions",
       "Prints trainctl's version, then trainerd's, with the LibTorch and CUDA versions it runs\n"
       "on and the NVIDIA driver's (when it has one). --client prints trainctl's alone, without\n"
       "a daemon. With -o json or yaml: {clientVersion, server: {...}}.\n",
       {{"client", "", "trainctl's version only (works offline)"}}},
      {"completion",
       "",
       "bash|zsh",
       /*min_args=*/1,
       /*max_args=*/1,
       "Print a shell completion script",
       "Prints a script that completes trainctl's commands, flags, loss, optimizer and other\n"
       "names, and (asking the daemon of the current context, within a second, silently when it\n"
       "cannot) dataset names and job ids.\n"
       "\n"
       "  source <(trainctl completion bash)                   # this shell\n"
       "  trainctl completion bash > /etc/bash_completion.d/trainctl\n"
       "  trainctl completion zsh > \"${fpath[1]}/_trainctl\"     # zsh\n",
       {}},
      {"__complete",
       "",
       "datasets|jobs",
       /*min_args=*/1,
       /*max_args=*/1,
       "Print dataset names or job ids for completion",
       "Prints the daemon's dataset names or job ids, one per line, for the completion\n"
       "scripts; prints nothing and exits 0 when the daemon does not answer within a second.\n",
       {},
       /*hidden=*/true},
      {"help",
       "",
       "[COMMAND]",
       /*min_args=*/0,
       /*max_args=*/2,
       "Show help for trainctl or a command",
       "Shows the usage of trainctl or of COMMAND; 'trainctl help exit-codes' lists the exit\n"
       "codes.\n",
       {}},
  };
  return *kCommands;
}

bool Invocation::Has(absl::string_view flag) const { return flags.count(std::string(flag)) > 0; }

std::string Invocation::Get(absl::string_view flag, absl::string_view fallback) const {
  auto it = flags.find(std::string(flag));
  return it == flags.end() ? std::string(fallback) : it->second;
}

absl::StatusOr<int64_t> Invocation::GetInt(absl::string_view flag, int64_t fallback, int64_t min,
                                           int64_t max) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  int64_t result = 0;
  if (!absl::SimpleAtoi(value, &result)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", value, "' is not a whole number"));
  }
  if (result < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be at least ", min, ", got ", result));
  }
  if (result > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be at most ", max, ", got ", result));
  }
  return result;
}

absl::StatusOr<uint64_t> Invocation::GetUint(absl::string_view flag, uint64_t fallback) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  uint64_t result = 0;
  if (absl::StartsWith(value, "-") || !absl::SimpleAtoi(value, &result)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value,
                                                   "' is not a whole number between 0 and ",
                                                   std::numeric_limits<uint64_t>::max()));
  }
  return result;
}

absl::StatusOr<double> Invocation::GetDouble(absl::string_view flag, double fallback) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  double result = 0;
  if (!absl::SimpleAtod(value, &result) || !std::isfinite(result)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value, "' is not a number"));
  }
  return result;
}

absl::StatusOr<Invocation> ParseCommandLine(const std::vector<std::string>& argv,
                                            std::optional<std::string> env_address) {
  Invocation invocation;
  if (env_address.has_value() && !env_address->empty()) {
    invocation.global.address = *env_address;
    invocation.global.address_from_env = true;
  }

  const CommandSpec* command = nullptr;
  std::string group;        // set while only the first of two command words has been seen
  bool only_words = false;  // after "--"

  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& token = argv[i];
    const bool is_flag = !only_words && token.size() >= 2 && token[0] == '-';
    if (!is_flag) {
      if (command != nullptr) {
        invocation.args.push_back(token);
      } else if (!group.empty()) {
        command = FindCommand(absl::StrCat(group, " ", token));
        if (command == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("unknown command '", group, " ", token,
                                                         "' (see 'trainctl ", group, " --help')"));
        }
      } else if (IsGroup(token)) {
        group = token;
      } else {
        command = FindCommand(token);
        if (command == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown command '", token, "'", UsageHint(nullptr)));
        }
      }
      continue;
    }
    if (token == "--") {
      only_words = true;
      continue;
    }

    // --name, --name=value, -x, -xVALUE, -x=VALUE
    std::string name;
    std::string shown;  // the flag as the user wrote it, for messages
    std::optional<std::string> inline_value;
    if (absl::StartsWith(token, "--")) {
      std::string body = token.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string::npos) {
        inline_value = body.substr(eq + 1);
        body.resize(eq);
      }
      name = body;
      shown = absl::StrCat("--", body);
    } else {
      name = token.substr(1, 1);
      shown = token.substr(0, 2);
      if (token.size() > 2) inline_value = token.substr(token[2] == '=' ? 3 : 2);
    }
    auto take_value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value.has_value()) return *inline_value;
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", shown, " needs a value"));
      }
      return argv[++i];
    };

    if (name == "h" || name == "help") {
      invocation.show_help = true;
      // "trainctl --help submit" asks about submit as "trainctl submit --help" does: the command
      // words may still follow.
      if (command == nullptr) {
        absl::StatusOr<const CommandSpec*> later =
            CommandAfterHelpFlag(argv, i + 1, only_words, &group);
        if (!later.ok()) return later.status();
        command = *later;
      }
      break;
    }
    if (name == "addr" || name == "address") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) return absl::InvalidArgumentError("--addr needs a HOST:PORT");
      invocation.global.address = *value;
      invocation.global.address_given = true;
    } else if (name == "context") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) return absl::InvalidArgumentError("--context needs a NAME");
      invocation.global.context = *value;
    } else if (name == "o" || name == "output") {
      // One meaning everywhere, as in kubectl: the output format (job model writes to --file).
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      absl::StatusOr<OutputFormat> format = ParseOutputFormat(*value);
      if (!format.ok()) return format.status();
      invocation.global.output = *format;
    } else if (name == "no-headers" && absl::StartsWith(token, "--")) {
      if (inline_value.has_value()) {
        return absl::InvalidArgumentError("flag --no-headers takes no value");
      }
      invocation.global.no_headers = true;
    } else if (name == "token-file" || name == "tls-ca" || name == "tls-cert" ||
               name == "tls-key" || name == "tls-server-name") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      std::string* field = name == "token-file" ? &invocation.global.token_file
                           : name == "tls-ca"   ? &invocation.global.tls_ca
                           : name == "tls-cert" ? &invocation.global.tls_cert
                           : name == "tls-key"  ? &invocation.global.tls_key
                                                : &invocation.global.tls_server_name;
      *field = *value;
    } else if (name == "timeout") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      absl::StatusOr<absl::Duration> timeout = ParseTimeout(*value);
      if (!timeout.ok()) return timeout.status();
      invocation.global.timeout = *timeout;
      invocation.global.timeout_given = true;
    } else if (const FlagSpec* flag = command == nullptr ? nullptr
                                      : absl::StartsWith(token, "--")
                                          ? FindFlag(*command, name)
                                          : FindShortFlag(*command, name);
               flag != nullptr) {
      name = std::string(flag->name);
      if (flag->value_name.empty()) {
        if (inline_value.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat("flag ", shown, " takes no value"));
        }
        invocation.flags[name] = "";
      } else {
        absl::StatusOr<std::string> value = take_value();
        if (!value.ok()) return value.status();
        invocation.flags[name] = *value;
      }
    } else {
      if (command != nullptr && command->path == "sweep" && name == "torchscript") {
        // Submit's one flag that sweep has not: say why rather than just "unknown".
        return absl::InvalidArgumentError(
            "--torchscript is for 'trainctl submit' only: the members of a sweep train a --model "
            "spec (see 'trainctl sweep --help')");
      }
      std::string where = command != nullptr ? absl::StrCat(" for '", command->path, "'") : "";
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", shown, "'", where, UsageHint(command)));
    }
  }

  if (invocation.show_help) {
    if (command != nullptr && command->path != "help") {
      invocation.help_text = CommandUsage(*command);
    } else if (command == nullptr && !group.empty()) {
      invocation.help_text = GroupUsage(group);
    } else {
      invocation.help_text = TopLevelUsage();
    }
    invocation.command = command;
    return invocation;
  }

  if (command == nullptr) {
    if (!group.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", group, "' needs a subcommand (see 'trainctl ", group, " --help')"));
    }
    return absl::InvalidArgumentError(absl::StrCat("no command given", UsageHint(nullptr)));
  }
  invocation.command = command;

  if (command->path == "help") {
    std::string topic = absl::StrJoin(invocation.args, " ");
    invocation.show_help = true;
    if (topic.empty()) {
      invocation.help_text = TopLevelUsage();
    } else if (topic == "exit-codes") {
      invocation.help_text = ExitCodesHelp();
    } else if (IsGroup(topic)) {
      invocation.help_text = GroupUsage(topic);
    } else if (const CommandSpec* about = FindCommand(topic); about != nullptr) {
      invocation.help_text = CommandUsage(*about);
      invocation.command = about;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", topic, "'", UsageHint(nullptr)));
    }
    return invocation;
  }

  const int count = static_cast<int>(invocation.args.size());
  if (count < command->min_args) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", command->path, "' needs ", command->args, UsageHint(command)));
  }
  if (count > command->max_args) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '",
                                                   invocation.args[command->max_args], "' for '",
                                                   command->path, "'", UsageHint(command)));
  }
  return invocation;
}

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag,
                                                 const std::string& value) {
  double seconds = 0;
  absl::Duration duration;
  if (absl::SimpleAtod(value, &seconds) && std::isfinite(seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(value, &duration)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", value, "' is not a number of seconds (or a duration like 2m)"));
  }
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be a positive, finite time, got '", value, "'"));
  }
  return duration;
}

std::string TopLevelUsage() {
  std::string text =
      "Usage: trainctl [--addr HOST:PORT|unix:PATH | --context NAME]\n"
      "                [-o table|wide|json|yaml|name] [--no-headers]\n"
      "                [--timeout SECONDS] [--token-file FILE] [--tls-ca FILE]\n"
      "                [--tls-cert FILE --tls-key FILE]\n"
      "                COMMAND [ARGS...]\n"
      "\n"
      "trainctl is the command-line client of trainerd, a daemon that trains models on datasets\n"
      "kept resident on the GPU.\n"
      "\n"
      "Commands:\n";
  for (const CommandSpec& command : Commands()) {
    if (command.hidden) continue;
    std::string line = CommandLine(command);
    if (command.path == "submit") line = "submit --dataset NAME --model SPEC";
    // The example shows the lists, which are what sets sweep apart from submit.
    if (command.path == "sweep") {
      line = "sweep --dataset NAME --model SPEC --lr 0.1,0.01 --seed 1,2";
    }
    if (line.size() >= kUsageColumn) {
      absl::StrAppend(&text, "  ", line, "\n  ", std::string(kUsageColumn, ' '), command.summary,
                      "\n");
    } else {
      absl::StrAppend(&text, "  ", PadRight(line, kUsageColumn), command.summary, "\n");
    }
  }
  absl::StrAppend(
      &text,
      "\n"
      "Global flags (before or after the command):\n"
      "  --addr HOST:PORT            trainerd's address (default: the context's, else\n"
      "                              $TRAINERD_ADDR, else the current context's, else ",
      kDefaultAddress,
      ")\n"
      "  --context NAME              a context of the config file ($TRAINCTL_CONFIG, else\n"
      "                              ~/.config/trainctl/config.yaml): its address and\n"
      "                              credentials, where no flag gives them (trainctl config)\n"
      "  -o, --output FORMAT         table (default), wide (more columns), json, yaml, or\n"
      "                              name (one name or id per line, for scripts)\n"
      "  --no-headers                tables without their header line\n"
      "  --timeout SECONDS           deadline of each request (default 30; diagnose 120,\n"
      "                              uploads at least 10 minutes, watching none)\n"
      "  --token-file FILE           send the bearer token in FILE with every call (default:\n"
      "                              $TRAINERD_TOKEN, the token itself, when set)\n"
      "  --tls-ca FILE               use TLS; trust trainerd's certificate if FILE (PEM)\n"
      "                              signed it (without it: TLS with the system's CAs when\n"
      "                              another --tls flag is given)\n"
      "  --tls-cert FILE, --tls-key FILE\n"
      "                              client certificate and key (PEM) for mutual TLS\n"
      "  --tls-server-name NAME      the name to check trainerd's certificate against\n"
      "  -h, --help                  show help\n"
      "\n"
      "Exit status: 0 success, 1 trainerd refused or could not be reached, 2 bad usage or\n"
      "local input, 3 the watched or awaited job failed, 4 it was cancelled ('trainctl help\n"
      "exit-codes').\n"
      "\n"
      "Run 'trainctl COMMAND --help' for a command's flags.\n");
  return text;
}

std::string CommandUsage(const CommandSpec& command) {
  std::string text = absl::StrCat("Usage: trainctl ", CommandLine(command));
  if (!command.flags.empty()) absl::StrAppend(&text, " [FLAGS]");
  absl::StrAppend(&text, "\n\n", command.description);
  if (!command.alias.empty()) {
    absl::string_view prefix = command.path.substr(0, command.path.rfind(' ') + 1);
    absl::StrAppend(&text, "\nAlias: trainctl ", prefix, command.alias, "\n");
  }
  if (!command.flags.empty()) {
    absl::StrAppend(&text, "\nFlags:\n");
    for (const FlagSpec& flag : command.flags) {
      std::string left = flag.short_name.empty()
                             ? absl::StrCat("--", flag.name)
                             : absl::StrCat("-", flag.short_name, ", --", flag.name);
      if (!flag.value_name.empty()) absl::StrAppend(&left, " ", flag.value_name);
      std::vector<absl::string_view> lines = absl::StrSplit(flag.help, '\n');
      for (size_t i = 0; i < lines.size(); ++i) {
        absl::StrAppend(&text, "  ", PadRight(i == 0 ? left : "", kUsageColumn), lines[i], "\n");
      }
    }
  }
  absl::StrAppend(&text,
                  "\nGlobal flags: --addr HOST:PORT, --context NAME, -o "
                  "table|wide|json|yaml|name, --no-headers,\n--timeout SECONDS, --token-file "
                  "FILE, --tls-ca FILE, --tls-cert FILE, --tls-key FILE,\n--tls-server-name NAME "
                  "(see 'trainctl --help').\n");
  return text;
}

std::string ExitCodesHelp() {
  return "trainctl's exit codes:\n"
         "  0  success\n"
         "  1  trainerd refused the request or could not be reached (or a wait timed out)\n"
         "  2  bad command line or local input (a file that cannot be read, a bad value);\n"
         "     nothing was sent\n"
         "  3  the watched or awaited job FAILED (job watch, job wait, submit --watch, sweep\n"
         "     --watch: any member)\n"
         "  4  the watched or awaited job was CANCELLED (sweep --watch: a member, none failed)\n"
         "\n"
         "  trainctl submit --dataset iris --model linear:3 --loss cross_entropy --watch\n"
         "  case $? in 0) echo trained;; 3) echo failed;; 4) echo cancelled;; *) echo error;; "
         "esac\n";
}

std::vector<std::pair<std::string, bool>> GlobalFlags() {
  return {{"addr", true},    {"context", true},         {"output", true}, {"no-headers", false},
          {"timeout", true}, {"token-file", true},      {"tls-ca", true}, {"tls-cert", true},
          {"tls-key", true}, {"tls-server-name", true}, {"help", false}};
}

std::vector<std::string> OutputFormatNames() { return {"table", "wide", "json", "yaml", "name"}; }

}  // namespace trainerd::client
