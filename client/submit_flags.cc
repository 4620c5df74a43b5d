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
           "train this module instead of --model, at most 64 MiB:\n"
           "an exported program (torch.export.save(torch.export.\n"
           "export(m.train(), (x,), dynamic_shapes=...), FILE),\n"
           "a .pt2) or a TorchScript module (torch.jit.script(m)\n"
           ".save(FILE)), told apart by the file's content"},
          {"loss", "LOSS",
           "mse, l1, huber or bce_with_logits (float32 targets\n"
           "shaped like the output), cross_entropy or nll (int64\n"
           "class targets; nll wants log-probabilities) (default:\n"
           "cross_entropy for int64 targets, mse for float32)"},
          {"huber-delta", "D", "huber: where the loss turns linear, > 0 (default 1)"},
          {"label-smoothing", "S",
           "cross_entropy: 0 <= S < 1 (default 0); training only:\n"
           "the validation loss is without it"},
          {"class-weights", "W,W,...",
           "cross_entropy and nll: one positive weight per class\n"
           "(torch's weight); batch loss = sum w[y]*l / sum w[y];\n"
           "training only (default: none)"},
          {"ignore-index", "N",
           "cross_entropy and nll: rows with target N add nothing;\n"
           "the mean is over the others, and validation leaves\n"
           "them out (default: none; PyTorch's is -100)"},
          {"pos-weight", "W,W,...",
           "bce_with_logits: one positive weight per output\n"
           "column on the positive targets (torch's pos_weight);\n"
           "training only (default: none)"},
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
           "learning-rate schedule, as torch.optim.lr_scheduler's:\n"
           "constant; step (StepLR: times --gamma every\n"
           "--step-epochs); multistep (MultiStepLR: times --gamma at\n"
           "each of --milestones); exponential (ExponentialLR:\n"
           "times --gamma every epoch); cosine (CosineAnnealingLR\n"
           "towards --min-lr); cosine_restarts\n"
           "(CosineAnnealingWarmRestarts: --t0, --t-mult,\n"
           "--min-lr); onecycle (OneCycleLR, max_lr --lr, every\n"
           "step, momentum not cycled); plateau (ReduceLROnPlateau\n"
           "on the validation loss) (default constant)"},
          {"schedule-per-step", "",
           "advance the schedule every optimizer step instead of\n"
           "every epoch: its epochs (--step-epochs, --milestones,\n"
           "--t0, cosine's span) count steps (not plateau;\n"
           "onecycle always is)"},
          {"step-epochs", "N",
           "step: epochs (steps when per step) between decays,\n"
           ">= 1 (required with step)"},
          {"milestones", "N,N,...",
           "multistep: the rate is multiplied by --gamma once each\n"
           "of these epochs (steps when per step) has passed,\n"
           "ascending, >= 1 (required with multistep)"},
          {"gamma", "G", "step, multistep, exponential: decay factor,\n0 < G <= 1 (default 0.1)"},
          {"min-lr", "RATE",
           "cosine and cosine_restarts: eta_min, the rate the\n"
           "cosine heads for, 0 <= RATE < --lr; no trained epoch\n"
           "(or step) reaches it; plateau: the floor of its\n"
           "reductions, >= 0 (default 0)"},
          {"t0", "N", "cosine_restarts: epochs (steps) of the first cycle, >= 1\n(required)"},
          {"t-mult", "N", "cosine_restarts: each cycle N times the last, >= 1\n(default 1)"},
          {"pct-start", "F",
           "onecycle: the fraction of the steps raising the rate,\n0 <= F <= 1 (default 0.3)"},
          {"anneal-strategy", "S", "onecycle: cos or linear (default cos)"},
          {"div-factor", "D", "onecycle: first rate --lr / D, > 0 (default 25)"},
          {"final-div-factor", "D",
           "onecycle: last step's rate --lr / --div-factor / D,\n> 0 (default 1e4)"},
          {"three-phase", "", "onecycle: up, down to the first rate, then down"},
          {"plateau-factor", "F", "plateau: multiply the rate by F, 0 < F < 1 (default 0.1)"},
          {"plateau-patience", "N",
           "plateau: epochs without improvement before a\nreduction, >= 0 (default 10)"},
          {"plateau-threshold", "T",
           "plateau: an improvement is below best * (1 - T),\n0 <= T < 1 (default 1e-4)"},
          {"plateau-cooldown", "N",
           "plateau: epochs after a reduction before counting,\n>= 0 (default 0)"},
          {"warmup-epochs", "N",
           "ramp the rate up linearly over the first N epochs,\n"
           "N < --epochs (default 0; not onecycle or plateau)"},
          {"warmup-steps", "N",
           "per step: ramp the rate up linearly over the first N\n"
           "steps, fewer than the job's steps (default 0)"},
          {"clip-grad-norm", "N",
           "scale the gradients down to a global L2 norm of at\n"
           "most N, > 0 (default 0: off)"},
          {"batch-size", "N", "rows per batch (default 32)"},
          {"gradient-accumulation-steps", "N",
           "step the optimizer once per N batches, on the sum of\n"
           "their gradients of loss / N (the epoch's last group too,\n"
           "however short), as PyTorch's usual accumulation loop;\n"
           "LibTorch path, one rank (default 1)"},
          {"drop-last", "",
           "drop each epoch's last batch when it is short, as\n"
           "DataLoader(drop_last=True) (default: train on it)"},
          {"epochs", "N", "passes over the dataset (default 10)"},
          {"validation-fraction", "F",
           "hold out this fraction of the rows (a split fixed by\n"
           "the seed) and report validation loss and, for\n"
           "cross_entropy and nll, accuracy each epoch,\n"
           "0 <= F < 1 (default 0: none); the validation loss\n"
           "is the plain loss, without label smoothing and\n"
           "weights, as an eval loop computes it"},
          {"validation-split-seed", "S",
           "draw the held-out rows from this seed instead of\n"
           "--seed, so that jobs with other seeds validate on the\n"
           "same rows (a sweep's members all use the sweep's seed)"},
          {"validation-dataset", "NAME",
           "validate on this resident dataset instead (same\n"
           "shapes and target dtype as --dataset; OWNER/NAME for\n"
           "another owner's)"},
          {"early-stop-patience", "N",
           "stop after N epochs without a better validation loss\n"
           "(or --early-stop-metric); needs validation (default 0:\n"
           "off)"},
          {"early-stop-min-delta", "D",
           "with --early-stop-patience: an epoch improves only when\n"
           "it beats the best by more than D, >= 0 (default 0)"},
          {"early-stop-metric", "M",
           "with --early-stop-patience (or a sweep's halving, whose\n"
           "rungs compare it): loss (lower is better) or accuracy\n"
           "(higher is better; cross_entropy and nll) (default loss)"},
          {"model-from", "WHICH",
           "the weights the job hands back: best (the best\n"
           "validation epoch's, by the early-stopping metric;\n"
           "needs validation) or last (default: best with\n"
           "--early-stop-patience, else last)"},
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
           "seed for initialisation, the validation split,\n"
           "shuffling and dropout masks (default: the daemon\n"
           "picks one and reports it in the job)"},
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
          {"no-shuffle", "",
           "train on the rows in the dataset's order every epoch\n"
           "(default: reshuffle every epoch)"},
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
                       "momentum, weight-decay, seed and any other flag above\n"
                       "that takes a value but the data's and placement's\n"
                       "(model, batch-size, epochs, optimizer, ...), then a line\n"
                       "per member (an empty cell keeps the flag's value; quote\n"
                       "a model spec: \"linear:64,relu,linear:10\")"});
      flags.push_back({"search", "FILE",
                       "a random search the daemon draws instead: a line per\n"
                       "flag, FLAG KIND VALUES, KIND uniform, log-uniform,\n"
                       "integer or log-integer LOW HIGH, or choice VALUE...,\n"
                       "e.g. 'lr log-uniform 1e-4 1e-1' ('-': stdin)"});
      flags.push_back({"trials", "N", "the members --search draws, 1 to 256"});
      flags.push_back({"search-seed", "S",
                       "the seed --search draws with: the same seed, the same\n"
                       "members (default 0)"});
      flags.push_back({"halving-min-epochs", "N",
                       "stop poor members early by successive halving (ASHA):\n"
                       "at rungs of N, N*F, N*F^2... epochs a member behind the\n"
                       "best 1/F of those that reached the rung before it stops\n"
                       "there (default: every member trains every epoch)"});
      flags.push_back({"halving-reduction-factor", "F", "halving's F, 2 to 100 (default 3)"});
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
