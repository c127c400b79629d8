#!/usr/bin/python3
"""The peer krab is measured against: PyTorch DDP (Gloo backend, CPU) training the same CNN on
the same Fashion-MNIST batches as `krab train` with model cnn, data fashion-mnist (the default),
or with --model gpt the same transformer on the same text windows as model gpt, data text.

What it measures: training throughput in samples/s after a warm-up (like krab's report), the
wall time, the final loss and (with --eval) the test accuracy. It prints ONE JSON line on stdout:
  {"samples_per_sec", "wall_seconds", "final_loss", "test_accuracy", "workers", "steps", ...}

Run from the repository root with Debian's python (the only one with torch here):
  /usr/bin/python3 bench/ddp_peer.py --workers 2 --steps 300
  /usr/bin/python3 bench/ddp_peer.py --workers 4 --epochs 2 --optimizer adam --lr 0.003 --cosine --eval
  /usr/bin/python3 bench/ddp_peer.py --model gpt --data corpus.txt --test-fraction 0.02 \
      --workers 2 --batch-size 128 --steps 100 --optimizer adam --lr 0.01 --eval-every 50
  /usr/bin/python3 bench/ddp_peer.py --scripted cnn.pt --workers 2 --steps 300
      (a TorchScript module instead of the nn.Module, on --model's data: own_model_speed.py)
  /usr/bin/python3 bench/ddp_peer.py --torchvision resnet18 --tensors train.pt --workers 2 \
      --batch-size 32 --steps 60 --optimizer adam --lr 0.001
      (torchvision.models.resnet18(num_classes=10) built after torch.manual_seed(--seed), on
      krab's `tensors` data: a torch.save'd {"x", "y"} file; bench/real_networks.py)

Multi-host mode (bench/slow_network.py uses it, one process per network namespace): with --rank
the script runs ONE rank itself instead of spawning --workers local ones, joins the rendezvous at
--master-addr:--master-port (hosted by rank 0) and binds Gloo to --iface (GLOO_SOCKET_IFNAME);
rank 0 prints the JSON line:
  /usr/bin/python3 bench/ddp_peer.py --rank R --world-size 4 --master-addr 10.0.0.1 \
      --master-port 29600 --iface eth0 --epochs 2 --eval-every 20
Under torchrun (bench/elastic_kill.py uses it): with --torchrun each process is the one rank
that torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT say (init_method env://, Gloo on
loopback); rank 0 prints the JSON line, as in multi-host mode:
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --max_restarts 3 \
      bench/ddp_peer.py --torchrun --epochs 2 --eval --checkpoint-dir ck --progress-file p
--checkpoint-dir DIR: rank 0 saves the model and optimizer state every --checkpoint-every steps
(default 50) to DIR/ddp_peer.pt (written to a temporary file, then renamed, so a kill never
leaves half a file), and every rank starts from it when it exists: torchrun's
restart-from-checkpoint. The JSON then says `resumed_from` (the step the run started from) and,
under torchrun, `restart_count`. --progress-file FILE: rank 0 rewrites FILE with the number of
completed steps after each step (as krab's --progress-file), also atomically.
--eval-every N evaluates on the test split every N steps and after the last step (as krab's
train.eval_every) and adds to the JSON `evals` = [{"step", "seconds", "test_accuracy"}], where
seconds are training seconds on rank 0 since the start of step 0 with evaluation time left out
(krab's report field of the same name), and `train_seconds` (the same at the last step);
evaluation time is also left out of samples_per_sec.

Kept identical to krab on purpose:
  - model: conv1 Conv2d(1,32,3,p=1) -> relu -> maxpool2 -> conv2 Conv2d(32,64,3,p=1) -> relu ->
    maxpool2 -> fc1 Linear(3136,128) -> relu -> fc2 Linear(128,10); cross-entropy loss;
    torch.manual_seed(seed) before the model is built (PyTorch's default initialisation, which
    LibTorch's C++ modules share);
  - data: the gzipped IDX files of Debian's dataset-fashion-mnist, pixels / 255, then
    (x - 0.286) / 0.353; the global batch of step s is the same as krab's (krab's sampler is
    re-implemented below: mt19937_64 + Fisher-Yates per epoch, drop the last partial batch),
    and worker r takes slice r of it; per-worker batch 64 by default;
  - one intra-op thread per worker (torch.set_num_threads(1); Debian's pthread OpenBLAS keeps
    its own thread pool unless OPENBLAS_NUM_THREADS is set, in krab's workers as in these);
    workers spawned with torch.multiprocessing; rendezvous and Gloo on 127.0.0.1 only
    (GLOO_SOCKET_IFNAME=lo);
  - learning rate: constant, or cosine lr * 0.5 * (1 + cos(pi * step / steps)) (krab's
    train.lr_schedule: cosine with train.warmup_steps: 0);
  - timing: samples/s counts the steps after the first --warmup-steps (default 10; krab uses
    min(10, max(1, steps / 10))), on rank 0, from the start of step `warmup` to the end of the
    last step; final_loss is the last step's loss averaged over workers; the test accuracy is
    computed on the whole 10k test split, sharded over the workers.
With --model gpt (src/models/gpt.cpp, src/data/text.cpp; --layers 2 --width 128 --heads 4
--context 64 --test-fraction 0.1 are krab's defaults):
  - model: tok_emb Embedding(256, w) + pos_emb Embedding(context, w); `layers` pre-LN blocks
    (ln1 -> attn: qkv Linear(w, 3w), causal softmax attention over `heads` heads with the mask
    and scaling written as krab writes them, proj Linear(w, w) -> residual; ln2 -> mlp: fc
    Linear(w, 4w) -> exact gelu -> proj Linear(4w, w) -> residual); ln_f LayerNorm; head
    Linear(w, 256) without bias. Same parameter names and order; GPT-2 initialisation
    (normal 0.02, the attn/mlp proj weights 0.02 / sqrt(2 layers), biases 0, LayerNorm 1/0)
    after torch.manual_seed(seed), each module constructed and initialised in krab's order, so
    that the initial parameters come out as krab's (checked: identical, see docs/benchmarks.md);
  - data: --data's bytes in windows of context + 1 (the tail dropped), the last
    round(windows x --test-fraction) windows held out, inputs = a window's first context
    bytes, targets = the same shifted by one; krab's sampler over the training windows;
  - loss: mean cross-entropy over all B x T positions; test accuracy: next-byte accuracy,
    argmax over the 256 logits equal to the target, over every position of every test window
    (krab's Model::correct), in chunks of 512 windows.
Nothing is downloaded.
"""
import argparse
import datetime
import gzip
import json
import math
import os
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.286, 0.353
MASK64 = (1 << 64) - 1


# --- krab's data order (src/data/rng.h, src/data/sampler.cpp), re-implemented -------------------

class MT19937_64:
    """std::mt19937_64, whose output sequence the C++ standard fixes."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & MASK64
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64
        self.index = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= 312:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _derive_seed(seed, stream):
    return _splitmix64(_splitmix64(seed) ^ _splitmix64((stream + 0x632BE59BD9B4E019) & MASK64))


def _uniform_below(rng, n):
    """Lemire's multiply-and-reject, as krab::data::uniform_below."""
    m = rng() * n
    low = m & MASK64
    if low < n:
        threshold = ((1 << 64) - n) % n
        while low < threshold:
            m = rng() * n
            low = m & MASK64
    return m >> 64


def krab_permutation(n, seed, epoch):
    rng = MT19937_64(_derive_seed(seed, epoch))
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = _uniform_below(rng, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _self_test_mt():
    # The C++ standard requires the 10000th output of a default-constructed mt19937_64 to be this.
    rng = MT19937_64(5489)
    for _ in range(9999):
        rng()
    assert rng() == 9981545732273789042, "MT19937_64 does not match std::mt19937_64"


# --- data and model -------------------------------------------------------------------------------

def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(prefix):
    images = read_idx(os.path.join(DATA_DIR, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA_DIR, prefix + "-labels-idx1-ubyte.gz"))
    # Same float32 operations, in the same order, as krab's loader.
    x = torch.from_numpy(images.copy()).unsqueeze(1).float().div_(255.0).sub_(MEAN).div_(STD)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


# --- --model gpt: krab's gpt (src/models/gpt.cpp) on krab's text data (src/data/text.cpp) ------

VOCAB = 256  # one token per byte value


def load_text(path, context, test_fraction):
    """krab's `text` loader: the file's bytes cut into windows of context + 1 bytes (the tail
    that does not fill one is dropped), the last round(windows x test_fraction) windows (at
    least 1 when test_fraction > 0, at most windows - 1) held out as the test split; inputs are
    a window's first `context` bytes, targets the same bytes shifted by one. Returns
    (train_x, train_y), (test_x, test_y), all int64 [N, context]."""
    with open(path, "rb") as f:
        raw = f.read()
    window = context + 1
    windows = len(raw) // window
    if windows < 2:
        sys.exit(f"ddp_peer: text file '{path}' has {len(raw)} bytes; context {context} needs "
                 f"at least {2 * window}")
    n_test = 0
    if test_fraction > 0:
        n_test = int(math.floor(windows * test_fraction + 0.5))  # std::llround, x >= 0
        n_test = min(max(n_test, 1), windows - 1)
    n_train = windows - n_test
    all_ = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, count=windows * window)
                            .reshape(windows, window).astype(np.int64))
    x, y = all_[:, :context].contiguous(), all_[:, 1:].contiguous()
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (y.view(b, t, self.heads, d).transpose(1, 2)
                   for y in self.qkv(x).chunk(3, -1))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
        return self.proj(torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = FeedForward(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """krab's gpt: same modules, names, parameter order and initialisation. The modules are
    also built in krab's order: each module constructed (its default initialiser drawing from
    torch's generator as LibTorch's does) and then given its GPT-2 initialisation before the
    next one is constructed: tok_emb, pos_emb, each block, ln_f, head."""

    def __init__(self, layers, width, heads, context, vocab=VOCAB):
        super().__init__()
        if width % heads:
            raise ValueError(f"--heads {heads} must divide --width {width}")
        self.context = context
        self.residual_std = 0.02 / math.sqrt(2.0 * layers)
        self.tok_emb = self._init("tok_emb", nn.Embedding(vocab, width))
        self.pos_emb = self._init("pos_emb", nn.Embedding(context, width))
        self.blocks = nn.ModuleList()
        for i in range(layers):
            self.blocks.append(self._init(f"blocks.{i}", Block(width, heads)))
        self.ln_f = nn.LayerNorm(width)
        self.head = self._init("head", nn.Linear(width, vocab, bias=False))

    def _init(self, path, module):
        with torch.no_grad():
            for key, p in module.named_parameters():
                name = f"{path}.{key}"
                if name.startswith("ln") or ".ln" in name:
                    continue  # LayerNorm keeps weight 1, bias 0
                if name.endswith(".bias"):
                    p.zero_()
                elif "attn.proj.weight" in name or "mlp.proj.weight" in name:
                    p.normal_(0.0, self.residual_std)
                else:
                    p.normal_(0.0, 0.02)
        return module

    def forward(self, tokens):
        t = tokens.size(1)
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t, dtype=torch.int64))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(args):
    if args.scripted:
        return torch.jit.load(args.scripted)  # the TorchScript module krab would train
    if args.torchvision:
        import torchvision  # only here: the other models do not need it installed
        return getattr(torchvision.models, args.torchvision)(num_classes=args.num_classes)
    if args.model == "gpt":
        return Gpt(args.layers, args.width, args.heads, args.context)
    return Cnn()


def load_data(args):
    """(train_x, train_y), (test_x, test_y) of the job's data."""
    if args.tensors:  # krab's `tensors` source, one file: x as saved, integer y as int64
        d = torch.load(args.tensors)
        return (d["x"], d["y"].long()), (d["x"][:0], d["y"][:0].long())
    if args.model == "gpt":
        return load_text(args.data, args.context, args.test_fraction)
    return load_split("train"), load_split("t10k")


def loss_fn(logits, y):
    # krab's Model::loss: mean cross-entropy over all predictions ([B, C] and [B, T, V] alike).
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


# --- one worker -----------------------------------------------------------------------------------

def evaluate(model, test_x, test_y, rank, W):
    """Test accuracy on the whole test split, sharded over the W ranks (a collective): argmax
    predictions equal to the target over all predictions (krab's Model::correct; for the gpt
    every position of every test window counts, i.e. next-byte accuracy)."""
    model.eval()
    n = test_x.size(0)
    lo, hi = n * rank // W, n * (rank + 1) // W
    correct = total = 0
    with torch.no_grad():
        for i in range(lo, hi, 512):
            logits = model(test_x[i:min(i + 512, hi)])
            y = test_y[i:min(i + 512, hi)]
            correct += int((logits.argmax(-1) == y).sum())
            total += y.numel()
    counts = torch.tensor([float(correct), float(total)], dtype=torch.float64)
    dist.all_reduce(counts)
    model.train()
    return counts[0].item() / counts[1].item() if counts[1].item() > 0 else 0.0


def write_atomic(path, write):
    """Calls write(tmp) and renames tmp to path: a reader (or a kill) never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def checkpoint_path(args):
    return os.path.join(args.checkpoint_dir, "ddp_peer.pt")


def worker(rank, args, port, queue):
    t_start = time.perf_counter()
    torch.set_num_threads(1)
    W = args.workers
    if args.torchrun:  # rank, world size and rendezvous from torchrun's environment
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=args.timeout_s))
    elif args.rank < 0:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=W)
    else:  # multi-host mode: one rank, rendezvous at rank 0's address
        dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{port}",
                                rank=rank, world_size=W,
                                timeout=datetime.timedelta(seconds=args.timeout_s))
    (train_x, train_y), (test_x, test_y) = load_data(args)

    b = args.batch_size
    G = b * W
    steps_per_epoch = train_x.size(0) // G
    steps = args.steps if args.steps > 0 else args.epochs * steps_per_epoch
    warmup = min(args.warmup_steps, max(steps - 1, 0))

    torch.manual_seed(args.seed)
    model = build_model(args)
    start = 0
    saved = None
    if args.checkpoint_dir and os.path.exists(checkpoint_path(args)):
        saved = torch.load(checkpoint_path(args))
        model.load_state_dict(saved["model"])
        start = saved["step"]
    ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])

    # Every epoch's order is computed before training (about 0.1 s each in Python), so that
    # none of it falls inside the timed steps.
    perms = [torch.tensor(krab_permutation(train_x.size(0), args.seed, e))
             for e in range((steps - 1) // steps_per_epoch + 1)]
    last_loss = 0.0
    evals = []
    eval_seconds = 0.0       # time spent evaluating, left out of the training time
    eval_seconds_warm = 0.0  # the part of it after the warm-up (left out of samples/s)
    t_warm = time.perf_counter()
    t_train = t_warm
    ddp.train()
    for step in range(start, steps):
        if step == warmup:
            t_warm = time.perf_counter()
            eval_seconds_warm = 0.0
        perm = perms[step // steps_per_epoch]
        begin = (step % steps_per_epoch) * G + rank * b
        idx = perm[begin:begin + b]
        x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
        lr = args.lr
        if args.cosine:
            lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * min(step / max(1, steps), 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last_loss = loss.item()
        if rank == 0 and args.checkpoint_dir and (step + 1) % args.checkpoint_every == 0 \
                and step + 1 < steps:
            # Every rank holds the same state after the step: rank 0's copy is the run's.
            state = {"step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict()}
            write_atomic(checkpoint_path(args), lambda tmp: torch.save(state, tmp))
        if rank == 0 and args.progress_file:
            write_atomic(args.progress_file, lambda tmp: open(tmp, "w").write(f"{step + 1}\n"))
        if args.log_every > 0 and (step + 1) % args.log_every == 0:
            # As krab's step lines: the step's loss averaged over the workers (global batch).
            step_loss = torch.tensor([last_loss], dtype=torch.float64)
            dist.all_reduce(step_loss)
            if rank == 0:
                print(f"ddp_peer: step {step + 1} loss {step_loss.item() / W:.6g}",
                      file=sys.stderr, flush=True)
        if args.eval_every > 0 and ((step + 1) % args.eval_every == 0 or step + 1 == steps):
            t_eval = time.perf_counter()
            seconds = t_eval - t_train - eval_seconds
            accuracy = evaluate(model, test_x, test_y, rank, W)
            evals.append({"step": step + 1, "seconds": seconds, "test_accuracy": accuracy})
            if rank == 0 and args.log_every > 0:
                print(f"ddp_peer: step {step + 1} test accuracy {accuracy:.4f} "
                      f"({seconds:.1f} training seconds)", file=sys.stderr, flush=True)
            spent = time.perf_counter() - t_eval
            eval_seconds += spent
            if step >= warmup:
                eval_seconds_warm += spent
    t_end = time.perf_counter()
    measured = steps - max(warmup, start)  # a resumed run times only the steps it ran
    samples_per_sec = (measured * G / (t_end - t_warm - eval_seconds_warm)
                       if measured > 0 else 0.0)

    result = {}
    if evals:
        result["evals"] = evals
        result["train_seconds"] = evals[-1]["seconds"]
        result["test_accuracy"] = evals[-1]["test_accuracy"]  # the last step's evaluation
    elif args.eval:
        result["test_accuracy"] = evaluate(model, test_x, test_y, rank, W)
    loss_t = torch.tensor([last_loss], dtype=torch.float64)
    dist.all_reduce(loss_t)
    if rank == 0:
        result.update({
            "peer": "pytorch-ddp",
            "torch": torch.__version__,
            "backend": "gloo",
            "workers": W,
            "batch_size": b,
            "global_batch": G,
            "steps": steps,
            "epochs": steps / steps_per_epoch,
            "warmup_steps": warmup,
            "model": (args.torchvision or args.model) + (" (scripted)" if args.scripted else ""),
            "parameters": sum(p.numel() for p in model.parameters()),
            "optimizer": args.optimizer,
            "lr": args.lr,
            "schedule": "cosine" if args.cosine else "constant",
            "threads_per_worker": torch.get_num_threads(),
            "samples_per_sec": samples_per_sec,
            "final_loss": loss_t.item() / W,
            "wall_seconds": time.perf_counter() - t_start,
        })
        if args.checkpoint_dir:
            result["resumed_from"] = start
        if args.torchrun:
            result["restart_count"] = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if queue is not None:
            queue.put(json.dumps(result))
        else:  # multi-host mode: rank 0 prints the result itself
            print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if args.torchrun:
        # torch 1.13 can hang here forever otherwise: when this function's locals go, DDP's
        # Reducer destroys the Gloo group, whose destructor joins a Gloo thread that waits for
        # the GIL this thread holds (seen once on rank 1 of a group torchrun had restarted).
        # Everything is done and printed; leave without the destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "gpt"], default="cnn",
                   help="cnn on Fashion-MNIST (default) or gpt on --data (krab's text)")
    p.add_argument("--scripted", metavar="FILE",
                   help="train this TorchScript module (torch.jit.load; bench/own_model_speed.py) "
                        "instead of --model's nn.Module, on --model's data")
    p.add_argument("--torchvision", metavar="NAME",
                   help="train torchvision.models.NAME(num_classes=--num-classes), random "
                        "initialisation, instead of --model's nn.Module")
    p.add_argument("--num-classes", type=int, default=10, help="with --torchvision")
    p.add_argument("--tensors", metavar="FILE",
                   help="train on this torch.save'd {'x', 'y'} file (krab's data.name: tensors, "
                        "one file, no test split) instead of --model's data")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="optimizer steps; 0 = use --epochs")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--cosine", action="store_true", help="cosine learning-rate decay to 0")
    p.add_argument("--warmup-steps", type=int, default=10, help="steps excluded from timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="report test_accuracy")
    p.add_argument("--log-every", type=int, default=0,
                   help="print the step's loss averaged over the workers every N steps on stderr "
                        "(as krab's train.log_every)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps and after the last one; adds `evals` and "
                        "`train_seconds` to the JSON (0 = off)")
    gpt = p.add_argument_group("--model gpt (defaults: krab's model.* and data.test_fraction)")
    gpt.add_argument("--data", help="the text corpus (krab's data.path); required for gpt")
    gpt.add_argument("--layers", type=int, default=2)
    gpt.add_argument("--width", type=int, default=128)
    gpt.add_argument("--heads", type=int, default=4)
    gpt.add_argument("--context", type=int, default=64)
    gpt.add_argument("--test-fraction", type=float, default=0.1)
    multi = p.add_argument_group("multi-host mode (one rank per process; --workers is ignored)")
    multi.add_argument("--rank", type=int, default=-1, help="this process's rank (enables the mode)")
    multi.add_argument("--world-size", type=int, default=0)
    multi.add_argument("--master-addr", help="rank 0's address (it hosts the rendezvous)")
    multi.add_argument("--master-port", type=int, default=29500)
    multi.add_argument("--iface", help="interface Gloo binds to (sets GLOO_SOCKET_IFNAME)")
    multi.add_argument("--timeout-s", type=float, default=300,
                       help="rendezvous and collective timeout in seconds")
    run = p.add_argument_group("under torchrun: restart from a checkpoint")
    run.add_argument("--torchrun", action="store_true",
                     help="one rank per process from torchrun's RANK, WORLD_SIZE, MASTER_ADDR "
                          "and MASTER_PORT (--workers is ignored)")
    run.add_argument("--checkpoint-dir", help="save DIR/ddp_peer.pt every --checkpoint-every "
                                              "steps (rank 0) and start from it when present")
    run.add_argument("--checkpoint-every", type=int, default=50)
    run.add_argument("--progress-file", help="rank 0 rewrites FILE with the completed steps")
    args = p.parse_args()
    if args.torchrun:
        if args.rank >= 0 or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            p.error("--torchrun needs torchrun's RANK and WORLD_SIZE and no --rank")
        args.workers = int(os.environ["WORLD_SIZE"])
    if args.checkpoint_every < 1:
        p.error("--checkpoint-every must be >= 1")
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    if args.rank >= 0:
        if args.world_size < 1 or args.rank >= args.world_size or not args.master_addr:
            p.error("multi-host mode needs --world-size > --rank >= 0 and --master-addr")
        args.workers = args.world_size
    if args.workers < 1 or args.batch_size < 1 or (args.steps <= 0 and args.epochs <= 0):
        p.error("--workers, --batch-size and --steps or --epochs must be positive")
    if args.eval_every < 0:
        p.error("--eval-every must be >= 0")
    if args.tensors and (args.eval or args.eval_every):
        p.error("--tensors has no test split: no --eval or --eval-every")
    if args.model == "gpt":
        if not args.data or not os.path.isfile(args.data):
            p.error("--model gpt needs --data FILE (a text corpus)")
        if min(args.layers, args.width, args.heads) < 1 or args.context < 2 \
                or args.width % args.heads or not 0 <= args.test_fraction < 1:
            p.error("--layers, --width, --heads >= 1, --context >= 2, --heads dividing "
                    "--width and 0 <= --test-fraction < 1")

    _self_test_mt()
    if args.torchrun:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        worker(int(os.environ["RANK"]), args, None, None)  # rank 0 prints the JSON line
        return
    if args.rank >= 0:
        if args.iface:
            os.environ["GLOO_SOCKET_IFNAME"] = args.iface
        worker(args.rank, args, args.master_port, None)  # rank 0 prints the JSON line
        return
    # Loopback only, for the rendezvous (init_method) and for Gloo's data connections.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # Deliberately no OMP_NUM_THREADS / OPENBLAS_NUM_THREADS here: the workers run in the
    # caller's environment, as krab's workers do (bench/throughput.py --openblas-threads sets
    # it for both sides). torch.set_num_threads(1) does not limit Debian's pthread OpenBLAS.
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    t0 = time.perf_counter()
    mp.spawn(worker, args=(args, free_port(), queue), nprocs=args.workers, join=True)
    result = json.loads(queue.get())
    result["launch_seconds"] = time.perf_counter() - t0  # spawn + imports + training + exit
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
