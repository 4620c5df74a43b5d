// trainctl's command table (Commands() in client/cli.h): every command's words, alias,
// arguments, summary, description and flags, in the order the usage lists them. The parser
// (cli.cc), the usage texts (usage_text.cc) and the completion scripts (completion.cc) all read
// it, so a command or flag added here reaches each of them. Submit's and sweep's many flags are
// in submit_flags.cc.
#include <vector>

#include "client/cli.h"
#include "client/cli_internal.h"

namespace trainerd::client {

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
       "is skipped, and so is the index pandas writes first (an unnamed column of distinct whole\n"
       "numbers: df.to_csv without index=False). NAME matches [A-Za-z0-9._-]{1,128}; it is one of your datasets (names are\n"
       "per owner: another tenant may have a dataset of the same name).\n"
       "\n"
       "With --targets, the targets keep the file's type: an int64 array uploads int64 class\n"
       "indices, a float array float32 values. A CSV target column written as whole numbers\n"
       "only (2, not 2.0), none negative, uploads int64 class indices. --target-dtype overrides\n"
       "either; what was inferred is said on stderr.\n"
       "\n"
       "  trainctl dataset upload iris iris.csv                # class column: int64\n"
       "  trainctl dataset upload prices prices.csv --target-dtype float32\n"
       "  trainctl dataset upload mnist images.npy --targets labels.npy   # int64 labels\n",
       {{"target-columns", "N", "trailing columns that are targets (default 1)"},
        {"target-dtype", "TYPE",
         "float32 (regression, mse) or int64 (class indices,\n"
         "cross_entropy; needs one target column) (default: a\n"
         "--targets .npy file's own, int64 for an int64 array;\n"
         "a CSV column of whole numbers: int64; else float32)"},
        {"targets", "FILE.npy",
         "targets as a separate .npy array with one row per feature row;\n"
         "FILE must then be .npy too"}}},
      {"dataset list",
       "ls",
       "",
       /*min_args=*/0,
       /*max_args=*/0,
       "List the resident datasets",
       "Lists the datasets you may see, by name: yours by their bare names, other owners' (shared\n"
       "with you, or all of them for an admin) as OWNER/NAME.\n",
       {}},
      {"dataset get",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Show one dataset",
       "Shows dataset NAME: one of yours, or OWNER/NAME for another owner's.\n",
       {}},
      {"dataset rm",
       "delete",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Delete a dataset",
       "Deletes dataset NAME (or OWNER/NAME, for an admin): frees its device memory and removes\n"
       "its file. Fails while a queued or running job uses it.\n",
       {}},
      {"dataset share",
       "",
       "NAME",
       /*min_args=*/1,
       /*max_args=*/1,
       "Let other tenants' jobs train on a dataset",
       "Shares dataset NAME with every caller of the daemon: their jobs may train on it and\n"
       "they see it in their lists as OWNER/NAME (yours: YOU/NAME) and train on it by that name;\n"
       "only you (its owner) and admins may change or delete it. Kept across restarts. Undo\n"
       "with: trainctl dataset unshare NAME\n",
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
       "With --points FILE the members are the file's lines instead, in order (a random search,\n"
       "or any set no product gives): CSV whose header names some of lr, momentum, weight-decay\n"
       "and seed; an empty cell, or a column left out, keeps the value of that flag, which then\n"
       "takes one value. '-' reads the file from stdin.\n"
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
       "      --weight-decay 0,0.01,0.1 -o json\n"
       "  printf 'lr,seed\\n0.1,1\\n0.02,2\\n0.005,3\\n' | trainctl sweep --dataset iris \\\n"
       "      --model linear:3 --points - --watch\n",
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
       "With --sweep ID, the members of that sweep (as 'trainctl sweep' printed its id), every "
       "one,\n"
       "in the table 'sweep --watch' shows: sorted by loss, with their values, state, epoch and\n"
       "losses, and the summary line once all ended. With --watch too, follows them as 'sweep\n"
       "--watch' does, with its exit codes: how a sweep submitted from a notebook or CI is\n"
       "picked up again.\n"
       "\n"
       "  trainctl job list --state running\n"
       "  trainctl job list --dataset iris --limit 10\n"
       "  trainctl job list --all -o json > jobs.json\n"
       "  trainctl job list --sweep sweep-f6e17bb93128 --watch\n",
       {{"state", "STATE",
         "only jobs in this state: queued, running, succeeded,\nfailed or cancelled"},
        {"dataset", "NAME", "only jobs on this dataset (OWNER/NAME: another owner's)"},
        {"sweep", "ID", "only the members of this sweep, every one, in order"},
        {"watch", "", "with --sweep: follow its members until all ended"},
        {"limit", "N", "at most the newest N jobs, 1..1000 (default 50)"},
        {"all", "", "every job, page by page, oldest first"}}},
      {"job get",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Show one job",
       "Shows job ID: its state, spec, progress, timing and (for small models) the trained\n"
       "parameters; -o json prints every parameter value. An epoch's loss (and the final loss,\n"
       "the last epoch's) is the mean over the rows that trained, each batch's mean loss\n"
       "weighted by its rows, not the mean of the batch means.\n",
       {}},
      {"job watch",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Follow a job's epochs until it ends",
       "Prints the epochs finished so far, then each epoch as it finishes (its loss: the mean\n"
       "over the rows that trained), then how the job ended. Exits 0 when the job succeeded, 3 "
       "when it failed and 4 when it was cancelled\n"
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
       "Downloads the trained model of job ID. --format torchscript (the default): a TorchScript\n"
       "archive, which Python loads with torch.jit.load(FILE) and C++ with torch::jit::load(FILE);\n"
       "its forward takes a float32 batch shaped like the dataset's features and returns the\n"
       "model's output, in eval form (dropout off, batchnorm on its running statistics).\n"
       "--format safetensors: the trained weights as a safetensors state_dict, which loads\n"
       "without running code (safetensors.torch.load_file(FILE)); a spec-built model's names are\n"
       "nn.Sequential's (0.weight, 0.bias, 2.weight, ...), so that nn.Sequential built from the\n"
       "same spec takes it with load_state_dict, and a TorchScript job's are its module's own.\n"
       "--format pt2: the model as a .pt2 for torch.export.load: an exported program's job\n"
       "gets its trained program back, a spec-built job the program of nn.Sequential(...).eval()\n"
       "with its weights, any batch size. A TorchScript job's .pt2 is made where its Python\n"
       "class is (the Python client's job.export). With --file the file is written\n"
       "whole or not at all; without it the archive goes to standard output, which must then\n"
       "not be a terminal. Only a job that succeeded has a model. -o is the output format, as\n"
       "everywhere: with --file, -o json or yaml describes what was written. The download takes\n"
       "at most the size the daemon declares for the model, and none above --max-size: a daemon\n"
       "that declares more, or sends more than it declared, is stopped and nothing is kept.\n"
       "\n"
       "  trainctl job model job-0123456789ab -f model.pt\n"
       "  trainctl job model job-0123456789ab > model.pt\n"
       "  trainctl job model job-0123456789ab --format safetensors -f model.safetensors\n"
       "  trainctl job model job-0123456789ab --format pt2 -f model.pt2\n",
       {{"file", "FILE", "where to write the model (default: standard output)", "f"},
        {"format", "FORMAT",
         "torchscript (default: the archive for torch.jit.load), safetensors (the\n"
         "state_dict) or pt2 (torch.export's archive)"},
        {"max-size", "SIZE",
         "the largest model to download, e.g. 512MiB (default 8256MiB: the largest model the "
         "daemon trains)"}}},
      {"job checkpoint",
       "",
       "ID",
       /*min_args=*/1,
       /*max_args=*/1,
       "Download one of a job's checkpoints",
       "Downloads a checkpoint of job ID (trainctl job get lists them): --epoch N's, or the\n"
       "newest. The file is the archive the daemon resumes the job from, LibTorch's\n"
       "torch::serialize::OutputArchive (a ZIP that torch.jit.load opens): the model's\n"
       "parameters and buffers under \"model\", the optimizer's state under \"optimizer\", the\n"
       "loop's state under \"meta\" and, for a job that hands back its best epoch, that epoch's\n"
       "weights under \"best_model\". With --file the file is written whole or not at all;\n"
       "without it the archive goes to standard output, which must then not be a terminal. -o\n"
       "is the output format, as everywhere: with --file, -o json or yaml describes what was\n"
       "written. A checkpoint larger than --max-size is not downloaded.\n"
       "\n"
       "  trainctl job checkpoint job-0123456789ab -f last.pt\n"
       "  trainctl job checkpoint job-0123456789ab --epoch 5 -f epoch5.pt\n",
       {{"epoch", "N", "the checkpoint's epoch (default: the newest)"},
        {"file", "FILE", "where to write the checkpoint (default: standard output)", "f"},
        {"max-size", "SIZE",
         "the largest checkpoint to download, e.g. 512MiB (default 41024MiB: a checkpoint of "
         "the largest model the daemon trains)"}}},
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

}  // namespace trainerd::client
