// The table of every krab configuration key: name, type, default, bounds and the text
// docs/config.md shows (config_keys.cpp renders it and serves registry()).
//
// To add a knob: add one entry to its section's function below, where a reader of
// docs/config.md would look for it (a new section also needs a line in config_keys.cpp's
// kSections and a function here); regenerate
// docs/config.md with `KRAB_REGENERATE_DOCS=1 build/bin/core_config_test
// --gtest_filter='*Docs*'` (core_config_test fails while the checked-in file differs); and read
// the value with Config::get_*. Every node of a job must then agree on it, unless it is listed
// in per_node_keys() (cli/job_agreement.cpp). Keys shared by several models or datasets say in
// their doc which one uses them.
#include "core/config_key_table.h"

#include <iterator>

#include "core/config_key_specs.h"

namespace krab::core {
namespace {

using namespace key_specs;  // NOLINT(google-build-using-namespace): the table's own makers

// Keys at the top level of the job file.
std::vector<KeySpec> top_level_keys() {
  return {
      string_key("name", "",
                 "Job name, used in `checkpoint.dir` and reports; empty means the job file's "
                 "stem (`jobs/mnist.yaml` gives `mnist`)."),
  };
}

// The `model.*` keys.
std::vector<KeySpec> model_keys() {
  return {
      string_key("model.name", "cnn",
                 "Network to train: `mlp` (multi-layer perceptron), `cnn` (small convolutional "
                 "net for images), `gpt` (decoder-only transformer for text) or `torchscript` "
                 "(your own module saved from Python, `model.path`; see docs/models.md).",
                 {"mlp", "cnn", "gpt", "torchscript"}),
      path_key("model.path", "",
               "The `torchscript` model's file, written by `torch.jit.script(m).save(FILE)` "
               "or `torch.jit.trace(m.eval(), x).save(FILE)` (a trace made in train mode is "
               "refused: docs/models.md)."),
      bool_key("model.freeze_batchnorm", "false",
               "`torchscript`: keep BatchNorm layers in eval mode while training (they use and "
               "keep their running statistics), so that a step does not depend on how the "
               "global batch is split over workers."),
      bool_key("model.trust_code", "false",
               "`torchscript`: load `model.path` without inspecting it. A TorchScript file is a "
               "program; by default krab reads its code before LibTorch loads it and refuses "
               "operators that reach files, processes or the network (docs/models.md). Set this "
               "only for a file you vouch for."),
      int_key("model.hidden", "128", "Hidden-layer width of the `mlp`.", 1),
      int_key("model.layers", "2", "Number of `gpt` decoder blocks.", 1),
      int_key("model.width", "128", "Embedding width of the `gpt` (d_model).", 8),
      int_key("model.heads", "4",
              "Attention heads of the `gpt`; must divide `model.width` (checked when the model "
              "is built).",
              1),
      int_key("model.context", "64", "Context length of the `gpt`, in tokens.", 2),
      bool_key("model.activation_checkpointing", "false",
               "Keep only each unit's input during the forward and run the unit again in "
               "backward (units: each `gpt` block; `cnn` conv1, conv2, fc1, fc2; `mlp` fc1, "
               "fc2, fc3; docs/models.md). Less activation memory for about one more forward "
               "per step; the gradients are bit-identical. A `torchscript` model's units are "
               "the children krab could split (docs/models.md); with none, a warning says "
               "nothing is recomputed. Federated clients do not apply it."),
  };
}

// The `data.*` keys of the source: which data, where, and images.
std::vector<KeySpec> data_source_keys() {
  return {
      string_key("data.name", "fashion-mnist",
                 "Dataset: `fashion-mnist` (28x28 grey images, 10 classes), `synthetic` "
                 "(generated classification data), `text` (a character-level corpus), `csv` "
                 "(a table of numeric columns with a label column), `images` (a folder of "
                 "PNG/JPEG files, one sub-folder per class) or `tensors` (tensors saved from "
                 "Python with `torch.save({\"x\": X, \"y\": Y}, FILE)`); docs/data.md.",
                 {"fashion-mnist", "synthetic", "text", "csv", "images", "tensors"}),
      path_key("data.path", "/usr/share/datasets/fashion-mnist",
               "Dataset directory for `fashion-mnist`, the corpus file for `text`, the "
               "`.csv` file for `csv`, the root folder (ROOT/<class>/<image>) for `images`, "
               "or for `tensors` one file or a directory whose `.pt` and `.pth` files are the "
               "shards of one data set; unused by `synthetic`."),
      path_key("data.tokenizer.sentencepiece", "",
               "`text`: a SentencePiece model file (`.model`, from `spm_train`) whose pieces are "
               "the tokens instead of bytes; `model.gpt` takes its vocabulary size from it. "
               "Empty: one token per byte (vocabulary 256)."),
      path_key("data.test_path", "",
               "`images`: the test split's root folder, with class folders named as the "
               "training ones; `tensors`: a file (read into memory) or a directory of shards "
               "(read a shard at a time, like `data.path`); empty = no test split."),
      list_key("data.size", "",
               "`images`: the size every image is resized to (bilinear), `[H, W]`, `H,W` or "
               "`HxW` (`28x28`; one number N = NxN); required for `images`."),
      int_key("data.channels", "0",
              "`images`: 1 (grey) or 3 (RGB) channels every image is converted to; 0 = the "
              "first training image's.",
              0, 3),
      list_key("data.mean", "0",
               "`images`: per-channel mean subtracted from pixels scaled to [0, 1]: one number, "
               "or one per channel (`[0.485, 0.456, 0.406]`)."),
      list_key("data.std", "1",
               "`images`: per-channel standard deviation pixels are divided by after "
               "`data.mean`: one number, or one per channel (`[0.229, 0.224, 0.225]`)."),
      int_key("data.random_crop", "0",
              "`images`, training only: pad each image with this many zeros on every side and "
              "cut a random window of `data.size`, drawn from (seed, epoch, example); 0 = off.",
              0),
      bool_key("data.random_flip", "false",
               "`images`, training only: mirror each image left to right with probability 1/2, "
               "drawn from (seed, epoch, example)."),
      int_key("data.decode_threads", "2",
              "`images`: background threads per worker that make the next batches (decoding "
              "the images from disk, resizing, augmenting) while the training thread computes, "
              "at most 2 per thread ahead; also the threads that check the files at load.",
              1, 64),
      int_key("data.max_pixels", "16777216",
              "`images`: the most pixels (height x width) an image file may state; a larger one "
              "is refused when its header is read, before its pixels are allocated (a 69-byte "
              "PNG can state 65535 x 65535). The default, 4096 x 4096, holds 4K frames and "
              "12-megapixel photos; every image is resized to `data.size` anyway.",
              1),
      bool_key("data.skip_bad", "false",
               "`images`: skip unreadable image files (counted in one note) instead of stopping "
               "with an error naming the file."),
  };
}

// The `data.*` keys of labels, memory, batching and the built-in sources.
std::vector<KeySpec> data_batch_keys() {
  return {
      int_key("data.num_classes", "0",
              "`tensors` with integer labels and `csv`: the number of classes; 0 means the "
              "largest training label + 1, at most 65536 (a larger label is an error naming it "
              "and its file: state the number here). A label outside [0, classes) is an error "
              "naming its file.",
              0),
      int_key("data.cache_mb", "1024",
              "`tensors` from a directory: MiB of shards each worker keeps in memory (least "
              "recently used dropped first); the data set itself may be any size. `images`: MiB "
              "of decoded training images each worker keeps, likewise.",
              1),
      int_key("data.shuffle_window", "0",
              "`tensors` from a directory: shards whose examples are shuffled together; each "
              "epoch shuffles the shard order, then the examples within each window of this "
              "many shards. 0 means as many as fit in `data.cache_mb`.",
              0),
      string_key("data.label_column", "label",
                 "`csv`: the column holding the class (an integer 0, 1, ...); every other "
                 "column is a feature."),
      int_key("data.batch_size", "64",
              "Samples in each worker's batch; the global batch is this times "
              "`parallel.workers`.",
              1),
      bool_key("data.normalize", "true",
               "For `fashion-mnist`, standardise pixels with mean 0.286 and std 0.353; for `csv`, "
               "standardise each column with the training split's mean and std."),
      int_key("data.synthetic_samples", "8192",
              "Samples generated for `synthetic`, train and test splits together.", 1),
      int_key("data.synthetic_features", "32", "Input features of each `synthetic` sample.", 1),
      int_key("data.synthetic_classes", "4", "Number of classes in `synthetic` data.", 2),
      float_key("data.test_fraction", "0.1",
                "Share of `synthetic`, `text` or `csv` data held out as the test split.", 0, 0.9),
  };
}

// The `train.*` keys.
std::vector<KeySpec> train_keys() {
  return {
      int_key("train.steps", "0", "Optimizer steps to run; 0 runs `train.epochs` epochs instead.",
              0),
      int_key("train.epochs", "1", "Passes over the training split when `train.steps` is 0.", 0),
      int_key("train.seed", "0",
              "Seed for initialisation and data order; the same seed gives the same global "
              "batches whatever the number of workers.",
              0),
      string_key("train.loss", "cross_entropy",
                 "Loss applied to a `torchscript` model's `forward(x)` (unless the module "
                 "defines `training_loss(x, y)`): `cross_entropy` or `nll` (class labels), `mse` "
                 "or `bce_with_logits` (outputs shaped as the labels). Built-in models use "
                 "`cross_entropy`.",
                 {"cross_entropy", "mse", "bce_with_logits", "nll"}),
      string_key("train.metric", "auto",
                 "What evaluation reports on the test split: `accuracy` (argmax of `predict(x)`, "
                 "or `forward(x)`, against class labels; `test_accuracy`) or `loss` (the "
                 "training loss's example-weighted mean; `test_loss`). `auto` is `accuracy` "
                 "unless the labels are values: `loss` for `train.loss` `mse` or "
                 "`bce_with_logits`, float labels, or a `torchscript` module with its own "
                 "`training_loss` and no `predict`.",
                 {"auto", "accuracy", "loss"}),
      string_key("train.optimizer.name", "sgd", "Optimizer: `sgd`, `adam` or `adamw`.",
                 {"sgd", "adam", "adamw"}),
      float_key("train.optimizer.lr", "0.05", "Learning rate.", 0),
      float_key("train.optimizer.momentum", "0.9", "Momentum of `sgd` (0 = plain SGD).", 0, 1),
      float_key("train.optimizer.weight_decay", "0",
                "Weight decay: an L2 penalty for `sgd` and `adam`, decoupled for `adamw`.", 0),
      string_key(
          "train.lr_schedule", "constant",
          "Learning-rate schedule: `constant`, `cosine` (half a cosine from the rate towards "
          "0, reached just after the last step) or `linear` (likewise, in a straight "
          "line); see `train.warmup_steps`.",
          {"constant", "cosine", "linear"}),
      int_key("train.warmup_steps", "0",
              "Steps over which the learning rate ramps up linearly to `train.optimizer.lr` "
              "before the schedule starts; 0 = none.",
              0),
      int_key("train.eval_every", "0",
              "Evaluate on the test split every N steps; 0 evaluates only at the end.", 0),
      int_key("train.eval_examples", "0",
              "Evaluate on the first N examples of the test split only (every evaluation: "
              "`train.eval_every`'s, the final one, the parameter server's and federated "
              "learning's held-out score); 0, or N past the split's end, uses the whole split. "
              "The same N examples whatever the number of workers, split among them as the "
              "whole split would be. For quick runs and tests: the report then says "
              "`eval_examples`, the number evaluated.",
              0),
  };
}

// The `train.*` keys of how a step runs: precision, batch (accumulated or adaptive), threads,
// the artificial straggler, logging.
std::vector<KeySpec> train_step_keys() {
  return {
      string_key("train.precision", "fp32",
                 "Arithmetic of the training forward: `fp32`, or `bf16` (LibTorch's CPU "
                 "autocast: matrix products and convolutions in bfloat16, losses in fp32; "
                 "parameters, gradients and optimizer state stay fp32; evaluation runs in "
                 "fp32). A model whose forward LibTorch 1.13 cannot autocast (a layer_norm "
                 "directly on a linear's output) fails its first step with an error naming this "
                 "key. Federated clients train in fp32.",
                 {"fp32", "bf16"}),
      int_key("train.grad_accum", "1",
              "Batches whose gradients are accumulated before each optimizer step.", 1),
      int_key("train.adaptive_batch.max", "0",
              "Adaptive batch: the largest global batch, in examples (0 = off: the batch stays "
              "`data.batch_size` x workers). The batch then grows and shrinks between "
              "`train.adaptive_batch.min` and this as the gradient noise scale and the measured "
              "cost of a step say, and the learning rate follows it (AdaScale's gain for `sgd`, "
              "its square root for `adam` and `adamw`). Each worker's batch stays "
              "`data.batch_size`; a larger one is accumulated. `train.steps`, "
              "`train.warmup_steps`, `train.eval_every` and `checkpoint.every_steps` then count "
              "steps of the smallest batch. A multiple of the global micro-batch "
              "(`data.batch_size` x workers), at most the training examples; needs 2 or more "
              "workers, `sync.mode: sync`, `parallel.zero_stage: 0`, `comm.compression` none, "
              "fp16 or bf16, no `elastic.enabled` and `train.grad_accum: 1`.",
              0),
      int_key("train.adaptive_batch.min", "0",
              "Adaptive batch: the smallest global batch and the one the run starts with, in "
              "examples; 0 = the global micro-batch (`data.batch_size` x workers), of which it "
              "must be a multiple.",
              0),
      float_key("train.adaptive_batch.overhead_examples", "0",
                "Adaptive batch: what a step costs whatever its batch (exposed communication, "
                "the optimizer), in examples' worth of compute; 0 measures it every 25 steps. "
                "Set, the batch depends on the gradients alone, so a run is reproducible.",
                0),
      int_key("train.threads_per_worker", "1",
              "CPU threads each worker's tensor ops may use (LibTorch's intra-op pool; krab's "
              "launcher also sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS to it unless they "
              "are set).",
              1),
      int_key("train.slow_rank", "-1",
              "Testing and benchmarks: this rank is made slower, an artificial straggler (-1 = "
              "none).",
              -1),
      float_key("train.slow_factor", "3",
                "How much slower `train.slow_rank` is: after each forward+backward it sleeps "
                "(factor - 1) times the time that took.",
                1),
      float_key("train.slow_delay_ms", "0",
                "If > 0, `train.slow_rank` sleeps this fixed time after each forward+backward "
                "instead of scaling with `train.slow_factor` (a calibrated straggler that does "
                "not depend on CPU contention).",
                0),
      int_key("train.log_every", "0",
              "Print `step N loss L` every N steps, L the step's mean training loss over its "
              "whole global batch (all workers), as the bar, the summary and the report's "
              "`final_loss` show it; 0 shows only the progress bar.",
              0),
  };
}

// The `parallel.*` keys.
std::vector<KeySpec> parallel_keys() {
  return {
      int_key("parallel.workers", "4", "Number of worker processes (model replicas).", 1),
      string_key("parallel.strategy", "dp",
                 "How work is split: `dp` is synchronous data parallel (every worker holds the "
                 "whole model; gradients are averaged each step).",
                 {"dp"}),
      float_key("parallel.bucket_mb", "25",
                "Size in MiB of the gradient buckets reduced together; 0 gives every gradient "
                "tensor a bucket of its own.",
                0),
      bool_key("parallel.broadcast_buffers", "true",
               "`sync.mode: sync`: after every step rank 0's buffers (BatchNorm running "
               "statistics) are broadcast to all workers, as PyTorch DDP's broadcast_buffers, so "
               "that every forward, evaluation and checkpoint sees the same buffers; false leaves "
               "each worker its own. Models without buffers send nothing."),
      int_key("parallel.zero_stage", "0",
              "ZeRO sharding over the data-parallel workers (`sync.mode: sync`): 0 every "
              "worker holds the whole model, its gradients and optimizer state; 1 each worker "
              "keeps the optimizer state of 1/N of the parameters, updates that part and "
              "all-gathers the updated parameters; 2 also keeps only 1/N of the gradients "
              "(reduce-scattered during backward). Same parameters as 0 up to the order of "
              "additions; `comm.compression` fp16 and bf16 compose (through the reduce-scatter; "
              "at stages 1-2 also int8 and onebit, as closely as at stage 0, not bit for bit). 3 "
              "also shards the parameters: each unit (`parallel.wrap`) is all-gathered just "
              "before its forward and again before its backward and freed after each, so a "
              "worker holds 16 bytes per parameter / N (Adam) plus the units being gathered; "
              "the parameters outside units (the root unit) stay whole.",
              0, 3),
      int_key("parallel.prefetch", "1",
              "`parallel.zero_stage` 3: how many units ahead are all-gathered while a unit "
              "runs (the next ones in forward, the previous ones in backward), so that "
              "communication overlaps compute; each costs one unit's parameters in memory. 0: "
              "every unit is gathered when it starts.",
              0),
      string_key("parallel.offload", "none",
                 "`parallel.zero_stage` 1, 2 or 3: `disk` keeps each worker's optimizer state "
                 "(and at stage 3 its fp32 master shards) in a file, "
                 "`RUN_DIR/offload/rank-R.bin` (allocated in full at the start, removed at the "
                 "end), stepped unit by unit so that about two units' state is in RAM; stage 3 "
                 "reads a unit's master from it for each gather and drops it after; "
                 "the run is refused before training unless the file system has room for every "
                 "worker's file + 5%. Same parameters as without. `none`: in RAM.",
                 {"none", "disk"}),
      list_key("parallel.wrap", "auto",
               "`parallel.zero_stage` > 0: the units parameters are sharded by, as module-path "
               "globs (`*` matches within one path component), e.g. `[blocks.*]` or "
               "`[layer*, fc]`; parameters no unit takes form the root unit. `auto`: the "
               "model's own units (docs/models.md: each `gpt` block, each `cnn`/`mlp` layer, "
               "the children of a TorchScript module krab could split); a model without any: "
               "one unit per top-level child holding parameters. The report's `zero.units` "
               "and `zero.wrap` say which were chosen."),
      string_key("parallel.balance", "off",
                 "`sync.mode: sync`: `auto` sizes each worker's slice of the global batch by its "
                 "measured speed (forward and backward time, re-measured every "
                 "`parallel.balance_every` steps), so unequal workers finish their steps "
                 "together; each slice's loss is weighted by its size, so every step is still "
                 "the global batch's mean gradient (equal within float order to `off`; "
                 "bit-identical while the slices stay equal). The report's `balance.changes` "
                 "lists each new split. `off`: equal slices.",
                 {"off", "auto"}),
      int_key("parallel.balance_every", "10",
              "`parallel.balance: auto`: steps between two measurements of the workers' speed "
              "(each one small all-reduce).",
              1),
      float_key("parallel.balance_max_change", "0.25",
                "`parallel.balance: auto`: the most a slice moves at one rebalance, as a "
                "fraction of an equal slice (global batch / workers).",
                0.01, 1),
  };
}

// The `comm.*` keys.
std::vector<KeySpec> comm_keys() {
  return {
      string_key("comm.backend", "gloo",
                 "Collective backend: `gloo` (TCP) or `mpi` (needs krab built with MPI).",
                 {"gloo", "mpi"}),
      float_key("comm.timeout_s", "60",
                "Seconds a collective or rendezvous may block before it fails with a timeout.",
                0.1),
      bool_key("comm.debug_checks", "false",
               "Check before each collective that every rank calls the same op with the same "
               "sizes (slower; for debugging)."),
      string_key("comm.iface", "",
                 "Network interface (e.g. `eth0`) or local address Gloo binds to; empty picks "
                 "the address that routes to the rendezvous host."),
      string_key(
          "comm.compression", "none",
          "Gradient compression (see compress/compressor.h): `none` (fp32 all-reduce), "
          "`fp16`, `bf16` (16-bit casts), `int8` (stochastic rounding, scale per "
          "`comm.chunk`), `onebit` (sign and two scales per `comm.chunk`), `topk`, `randomk` "
          "(the `comm.ratio` largest or random values, all-gathered as sparse payloads or "
          "all-reduced at shared positions) or `powersgd` (rank `comm.rank`); `auto` starts "
          "with `none` and picks among `none`, `fp16`, `powersgd` and `topk` from the share of "
          "the step the workers wait for communication, checked again every 200 steps "
          "(docs/monitoring.md; `parallel.zero_stage` 0 only; the report's "
          "`compression_auto` lists the decisions). Needs `sync.mode: sync`.",
          {"none", "fp16", "bf16", "int8", "onebit", "topk", "randomk", "powersgd", "auto"}),
      float_key("comm.ratio", "0.01",
                "Fraction of the values `topk` and `randomk` send each step, in (0, 1].", 0, 1),
      int_key("comm.rank", "4", "Rank of `powersgd`'s low-rank approximation.", 1),
      int_key("comm.chunk", "0",
              "Values per scale for `int8` (fp32 scale, 4 bytes per chunk) and `onebit` (two bf16 "
              "scales, 4 bytes per chunk); 0 picks 256 for both.",
              0),
      string_key("comm.rotation", "hadamard",
                 "`onebit` only: `hadamard` turns each chunk by a randomized Hadamard transform "
                 "before taking signs (same bytes; spreads a chunk's mass over all its values, so "
                 "the sign keeps more of it; `comm.chunk` must be a power of 2), `none` takes the "
                 "signs of the values themselves. Other compressors ignore the default; naming "
                 "`hadamard` with one of them is an error.",
                 {"none", "hadamard"}),
      bool_key("comm.error_feedback", "true",
               "Add what compression left out to the next step's gradient (per worker, and per "
               "averaged piece for the codecs)."),
      int_key("comm.compress_warmup_steps", "0",
              "Optimizer steps reduced in plain fp32 before compression starts.", 0),
      int_key("comm.compress_min_numel", "1024",
              "Parameters with fewer elements (biases, norms) are reduced uncompressed.", 0),
      bool_key("comm.fold_momentum", "true",
               "`randomk` with `comm.error_feedback` only: run `sgd` without momentum, at "
               "learning rate lr / (1 - momentum), because random-k's error feedback is itself "
               "heavy-ball momentum (each value waits 1 / ratio steps on average: in expectation "
               "a velocity with factor 1 - ratio). Keeping both applies momentum twice. The "
               "`comm.compress_warmup_steps` run as plain sgd at that rate too. Other "
               "compressors ignore the default; naming `true` with one of them is an error."),
      float_key("comm.momentum_correction", "0",
                "Momentum applied by each worker before compression (every compressor): the "
                "workers' velocities are compressed and averaged instead of their gradients, as "
                "in Deep Gradient Compression (0 = off); use it with "
                "`train.optimizer.momentum: 0`. `topk`/`randomk` clear the velocity where they "
                "sent values.",
                0, 0.999),
      float_key("comm.clip_norm", "0",
                "Clip each worker's gradient (the compressed parameters of a bucket) to this L2 "
                "norm before momentum and error feedback (0 = off).",
                0),
  };
}

// The `sync.*` keys.
std::vector<KeySpec> sync_keys() {
  return {
      string_key("sync.mode", "sync",
                 "When workers agree: `sync` averages gradients every step; `local_sgd` lets "
                 "each worker step alone and averages the models every `sync.period` steps "
                 "(after `sync.warmup_steps` of `sync`; post-local SGD); `async` sends each "
                 "worker's gradient to parameter servers that apply it on arrival (bounded by "
                 "`sync.max_staleness`).",
                 {"sync", "local_sgd", "async"}),
      int_key("sync.period", "8", "`local_sgd`: steps between model averages.", 1),
      int_key("sync.warmup_steps", "0",
              "`local_sgd`: steps of plain `sync` before local steps begin.", 0),
      int_key("sync.servers", "0",
              "`async`: parameter-server processes; the parameters are split evenly between "
              "them. Needed (>= 1) for `async`; krab's launcher starts them on node 0.",
              0),
      int_key("sync.replicas", "0",
              "`async`: copies of each parameter-server shard beyond its primary. 1 = server s "
              "also mirrors shard s - 1: every update is applied on both before the worker's "
              "call is answered, and the workers fail over to the mirror when a primary dies "
              "(needs `sync.servers` >= 2; costs one more copy of each shard and one more hop "
              "per push).",
              0, 1),
      int_key("sync.max_staleness", "-1",
              "`async`: how many steps a worker may run ahead of the slowest live worker "
              "(stale-synchronous parallel). -1 = unbounded (a slow worker never slows the "
              "others); 0 = sync through the servers (each step's gradients averaged and "
              "applied once).",
              -1),
      int_key("sync.aggregate", "0",
              "`async`, `max_staleness` != 0: gradients averaged into one server update, from "
              "whichever workers sent them. 0 = one per worker (the optimizer takes the steps "
              "sync would, with the same batch, so learning rate, momentum and schedule carry "
              "over); 1 = every gradient applied as it arrives, with the learning rate / workers.",
              0),
      bool_key("sync.staleness_damping", "false",
               "`async`: scale each gradient by 1 / (1 + its staleness in server updates) "
               "(staleness-aware asynchronous SGD)."),
      bool_key("sync.extrapolate", "true",
               "`async`, `max_staleness` != 0: answer each pull with the parameters moved on "
               "along the last server update by the updates expected before the worker's "
               "gradient arrives, so the gradient is taken near the point it updates (as in "
               "DANA). The servers' own parameters, which the job saves and evaluates at the "
               "end, are not moved; worker 0's evaluations during training see the pulled ones."),
      float_key("sync.worker_timeout_s", "10",
                "`async`: a worker silent this long is counted out (nobody waits for it) until "
                "it calls again; a dead worker never stops the servers.",
                0.05),
  };
}

// The `elastic.*` keys (docs/design/elastic.md §7). krab's launcher (node 0's across machines)
// is the keeper of the membership (cli/launcher.cpp, elastic/local_keeper.h).
std::vector<KeySpec> elastic_keys() {
  return {
      bool_key("elastic.enabled", "false",
               "`sync.mode: sync`: a worker that dies (killed, crashed, or frozen or cut off: "
               "no heartbeat for `elastic.dead_after_ms`) no longer stops the run; the launcher "
               "(node 0's across machines) writes a new generation of members without it and "
               "the others go on with the same global batch, re-split among them. A worker "
               "that fails on bad input (exit 2) still stops the run. The launcher keeps "
               "`RUN_DIR/workers.json` (generation, and each rank's member id and pid) up to "
               "date and prints one line per change. Machines join a running run with `krab "
               "train JOB --join HOST:PORT`."),
      int_key("elastic.min_workers", "1",
              "`elastic.enabled`: fewest workers that train; below it the run waits "
              "`elastic.wait_s` for more, then writes a checkpoint and exits 1.",
              1),
      int_key("elastic.max_workers", "0",
              "`elastic.enabled`: most workers the run may have (joins stop here); 0 means "
              "`parallel.workers`. The global batch (`data.batch_size` x `parallel.workers`) "
              "must hold at least one example per worker.",
              0),
      float_key("elastic.wait_s", "60",
                "`elastic.enabled`: longest wait, in seconds, for a generation to form or for "
                "enough workers (`elastic.min_workers`).",
                0),
      int_key("elastic.heartbeat_ms", "200",
              "`elastic.enabled`: period of the workers' heartbeats, in milliseconds; a worker "
              "that an op failed on is dropped after 3 periods without a beat.",
              10),
      int_key("elastic.dead_after_ms", "3000",
              "`elastic.enabled`: a worker without a heartbeat for this many milliseconds is "
              "dropped from the run (a frozen or unreachable process).",
              100),
      float_key("elastic.lease_s", "5",
                "`elastic.enabled` with `--rdzv-backend etcd`: lifetime in seconds of each "
                "machine's lease in etcd (its launcher renews it three times per lease); a "
                "machine whose lease lapses is dropped, and when it led, another takes the "
                "membership over. At least 2, etcd's smallest lease.",
                2),
      bool_key("elastic.replace_dead", "false",
               "`elastic.enabled`: the launcher respawns a worker that died in its slot, as a "
               "new member that joins at a step boundary (within `elastic.max_workers`) and "
               "receives the state from rank 0; the others pause only for the transfer."),
      int_key("elastic.max_restarts", "3",
              "`elastic.replace_dead`: most replacements per local worker slot in a run, so a "
              "worker that dies at every start does not loop.",
              0),
      string_key("elastic.autoscale.provider", "none",
                 "`elastic.enabled`: `local` lets the launcher add workers on this machine (up to "
                 "`elastic.max_workers`) while the last addition paid and remove the last one "
                 "when it did not: it measures samples/s at each size over "
                 "`elastic.autoscale.window_steps` steps and compares each new worker's gain with "
                 "the average worker's (its efficiency). Changes are joins and graceful leaves: "
                 "no step is lost. `slurm`: the same, each added worker a one-task Slurm batch "
                 "job (`sbatch`, `scancel`, `sinfo` in PATH; the job's node must see the "
                 "launcher's TMPDIR: this machine, or a shared filesystem). `none`: the workers "
                 "stay as they are.",
                 {"none", "local", "slurm"}),
      float_key("elastic.autoscale.up_efficiency", "0.6",
                "`elastic.autoscale.provider`: keep adding workers while the last addition's "
                "efficiency (its samples/s gain over the average worker's before it) is at "
                "least this.",
                -10, 10),
      float_key("elastic.autoscale.down_efficiency", "0.3",
                "`elastic.autoscale.provider`: remove the last addition when its efficiency is "
                "below this; between the two thresholds nothing moves.",
                -10, 10),
      int_key("elastic.autoscale.window_steps", "20",
              "`elastic.autoscale.provider`: steps measured at each size (after 5 warm-up "
              "steps); the rate is the global batch over the median step time.",
              1),
      int_key("elastic.autoscale.cooldown_steps", "60",
              "`elastic.autoscale.provider`: no decision for this many steps after a removal.", 0),
      bool_key("elastic.replicate_shards", "true",
               "`elastic.enabled` with `parallel.zero_stage` > 0: every shard of the "
               "optimizer state (stage 3: and of the parameters) is also kept by the next rank "
               "(its buddy), so one death loses "
               "nothing: the survivors reshard the last committed step in memory. Costs one more "
               "shard of optimizer state per rank and one gradient shard sent per step."),
  };
}

// The `monitor.*` keys (docs/monitoring.md). Each machine may set its own: they are per node
// (cli/job_agreement.cpp).
std::vector<KeySpec> monitor_keys() {
  return {
      int_key("monitor.port", "0",
              "TCP port of this machine's monitoring endpoint: `/metrics` in Prometheus's text "
              "format (and the dashboard with `monitor.dashboard`), served by the launcher for "
              "its workers while the run lasts; 0 serves nothing. A port in use is refused "
              "before training starts.",
              0, 65535),
      string_key("monitor.bind", "127.0.0.1",
                 "Address the monitoring endpoint listens on: `127.0.0.1` (this machine only), "
                 "`0.0.0.0` (every interface) or one of this machine's addresses. It shows no "
                 "secret (no job secret, token or key file path), but it does show the job's "
                 "progress to whoever reaches it."),
      bool_key("monitor.dashboard", "false",
               "Serve a live dashboard at `/` of `monitor.port`: loss, accuracy, samples/s, "
               "each rank's step-time breakdown, traffic, memory and membership (`krab "
               "fl-server`: rounds, clients, test metric, bytes and privacy budget per round), "
               "drawn with the Chart.js that Debian packages (no internet needed)."),
      bool_key("monitor.profile_ops", "false",
               "With `--trace FILE`: also record LibTorch's operators (its own profiler) and "
               "merge them into the timeline; slows training."),
  };
}

// The `checkpoint.*` keys.
std::vector<KeySpec> checkpoint_keys() {
  return {
      path_key("checkpoint.dir", "runs/{name}",
               "Directory for checkpoints and reports; `{name}` is replaced by the job name."),
      path_key("checkpoint.hmac_key_file", "",
               "A file (outside the run directory, at least 32 bytes) holding a key: "
               "checkpoints and `fl-state.krab` are then sealed with HMAC-SHA256, bound to "
               "their run directory and model, and only such files are read back; the "
               "federated rounds released are counted in a file beside the key, so an older "
               "or deleted `fl-state.krab` is refused (docs/security.md); empty = CRC only."),
      int_key("checkpoint.every_steps", "0",
              "Write a checkpoint every N steps; 0 writes one only at the end.", 0),
      bool_key("checkpoint.resume", "false",
               "Resume from the newest checkpoint in `checkpoint.dir`, if there is one."),
      int_key("checkpoint.keep", "2",
              "Number of most recent step directories kept; older ones are deleted.", 1),
  };
}

}  // namespace

// Every key, section by section in the order docs/config.md lists them.
std::vector<KeySpec> build_registry() {
  std::vector<KeySpec> keys;
  for (auto section : {top_level_keys, model_keys, data_source_keys, data_batch_keys, train_keys,
                       train_step_keys, parallel_keys, comm_keys, sync_keys, elastic_keys,
                       federated_cohort_keys, federated_aggregation_keys, federated_privacy_keys,
                       federated_server_keys, monitor_keys, checkpoint_keys}) {
    std::vector<KeySpec> part = section();
    keys.insert(keys.end(), std::make_move_iterator(part.begin()),
                std::make_move_iterator(part.end()));
  }
  return keys;
}

}  // namespace krab::core
