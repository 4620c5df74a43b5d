// The flags of trainctl's submit and sweep (client/cli_internal.h), the JobSpec's fields, with
// their help texts. Kept apart from the rest of the command table (command_table.cc) for their
// number; sweep's are submit's, with lists for the swept values.
#include <vector>

#include "client/cli.h"
#include "client/cli_internal.h"

namespace trainerd::client {

std::vector<FlagSpec> SubmitFlags() {
  return {{"dataset", "NAME",
           "the resident dataset to train on (required): one of\n"
           "yours, or OWNER/NAME for one another owner shared"},
          {"model", "SPEC", "layers, e.g. linear:64,relu,linear:1 (required)"},
          {"torchscript", "FILE",
           "train this TorchScript module (torch.jit.script(m)\n"
           ".save(FILE), at most 64 MiB) instead of --model"},
          {"loss", "LOSS",
           "mse, l1, huber or bce_with_logits (float32 targets\n"
           "shaped like the output), cross_entropy or nll (int64\n"
           "class targets; nll wants log-probabilities) (default:\n"
           "cross_entropy for int64 targets, mse for float32)"},
          {"huber-delta", "D", "huber: where the loss turns linear, > 0 (default 1)"},
          {"label-smoothing", "S", "cross_entropy: 0 <= S < 1 (default 0)"},
          {"optimizer", "OPT",
           "sgd, adam, adamw, rmsprop, nadam, radam or adagrad,\n"
           "each as torch.optim's (default sgd)"},
          {"lr", "RATE", "learning rate, > 0; the peak with a schedule (default 0.01)"},
          {"momentum", "M", "sgd and rmsprop momentum, 0 <= M < 1 (default 0)"},
          {"nesterov", "", "sgd: Nesterov momentum (needs --momentum above 0)"},
          {"weight-decay", "W",
           "L2 penalty, >= 0; decoupled for adamw (default 0,\n"
           "adamw 0.01)"},
          {"weight-decay-exclude-bias-and-norm", "",
           "weight decay 0 for parameters of 1 dimension or\n"
           "fewer (biases, norm weights); needs a weight decay"},
          {"beta1", "B", "adam, adamw, nadam and radam, 0 <= B < 1 (default 0.9)"},
          {"beta2", "B", "adam, adamw, nadam and radam, 0 <= B < 1 (default\n0.999)"},
          {"eps", "E", "all but sgd, > 0 (default 1e-8, adagrad 1e-10)"},
          {"alpha", "A", "rmsprop smoothing, 0 < A < 1 (default 0.99)"},
          {"amsgrad", "", "adam and adamw: the AMSGrad variant"},
          {"centered", "", "rmsprop: centered (normalised by the variance)"},
          {"momentum-decay", "D", "nadam: >= 0 (default 0.004)"},
          {"decoupled-weight-decay", "",
           "nadam and radam: decay the weights as adamw does\n"
           "instead of an L2 penalty"},
          {"lr-decay", "D", "adagrad: rate of step t is lr / (1 + (t-1) D), >= 0\n(default 0)"},
          {"initial-accumulator-value", "V",
           "adagrad: starting squared-gradient sum, >= 0\n(default 0)"},
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
           "shapes and target dtype as --dataset; OWNER/NAME for\n"
           "another owner's)"},
          {"early-stop-patience", "N",
           "stop after N epochs without a better validation loss;\n"
           "needs validation (default 0: off)"},
          {"checkpoint-every", "N",
           "save model and optimizer state every N epochs under\n"
           "the daemon's data folder, 1 <= N <= --epochs\n"
           "(default 0: off)"},
          {"precision", "P",
           "fp32, bf16 or fp16: the forward pass under autocast;\n"
           "fp16 adds loss scaling as torch.amp.GradScaler with\n"
           "the optimizer: an overflowing step is skipped\n"
           "(default fp32)"},
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
          {"replicas", "N",
           "train on N ranks, data-parallel: each takes its slice of\n"
           "every global batch of N * --batch-size rows and the\n"
           "gradients are averaged, as one rank with batch\n"
           "N * --batch-size would train (CPU ranks; default 1)"},
          {"nodes", "NODE,...",
           "with --replicas: other daemons (peers of this one)\n"
           "that run some of the ranks, round the list after this\n"
           "daemon; each a context name or HOST:PORT as the daemon's\n"
           "--peers names it; 'all': every peer the daemon knows\n"
           "(its --peers, or the group a cluster manager started it\n"
           "in) (default: every rank here); sweep without --replicas:\n"
           "the members go round this daemon and the nodes, each\n"
           "training whole where it lands"},
          {"max-job-time", "T",
           "a --torchscript job's time limit, in seconds or as a\n"
           "duration (90m): its worker is killed and the job FAILED\n"
           "past it (default and most: the daemon's --max_job_time, 24h)"},
          {"no-shuffle", "", "keep the rows in order (default: reshuffle every epoch)"},
          {"request-id", "ID",
           "makes a retry safe: the same ID with the same request\n"
           "gets what its first call queued, not a second one\n"
           "(1-128 of A-Z a-z 0-9 . _ : -, e.g. a CI run's id)"},
          {"watch", "", "after submitting, follow the job as 'trainctl job watch' does"}};
}

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
      flags.push_back({"points", "FILE",
                       "the members one by one instead of the lists' product:\n"
                       "a CSV file ('-': stdin) whose header names some of lr,\n"
                       "momentum, weight-decay and seed, then a line per member\n"
                       "(an empty cell keeps the flag's single value)"});
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

}  // namespace trainerd::client
