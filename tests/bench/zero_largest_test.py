#!/usr/bin/python3
"""bench/zero_largest.py's pure parts, without cgroups or training (a second or two):
  - its closed-form parameter count against PyTorch's count of bench/ddp_peer.py's Gpt (krab's
    gpt, module for module) at several shapes;
  - how a run's end is classified: a pass needs exit 0 and a falling loss; an OOM kill counts
    only where the worker's cgroup reached its cap; krab's memory refusal and the stage-3
    refusal are named; a process this bench ended itself is not a failure;
  - the search's start moves up with the cap;
  - the table it prints, read back by summary_records.zero_largest and turned into summary rows.
Exit status 0 when every check holds; an AssertionError names the one that failed."""
import contextlib
import io
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "bench")
sys.path.insert(0, BENCH)

import ddp_peer  # noqa: E402
import summary  # noqa: E402
import summary_records  # noqa: E402
import zero_largest as zl  # noqa: E402


def check_parameter_count():
    for layers, width in ((1, 64), (2, 128), (3, 192)):
        model = ddp_peer.Gpt(layers, width, width // 64, zl.CONTEXT)
        torch_count = sum(p.numel() for p in model.parameters())
        assert zl.gpt_parameters(layers, width) == torch_count, (layers, width, torch_count)


def stats(failcnt=0, oom_kill=0):
    return {"max_usage": 0, "rss_sampled": 0, "failcnt": failcnt, "oom_kill": oom_kill}


def check_classify():
    ok = [stats()] * 2
    falling = [5.0 - 0.1 * i for i in range(20)]
    texts = ["krab: step 1 loss 5\n", ""]
    assert zl.classify([0, 0], texts, ok, False, falling, True)[0] == "pass"
    flat = [5.0] * 20
    assert zl.classify([0, 0], texts, ok, False, flat, True)[0] == "error"
    assert zl.classify([0, 0], texts, ok, False, falling[:3], True)[0] == "error"
    # The cgroup's OOM killer: the group hit its cap and a process was killed.
    status, detail = zl.classify([1, None], ["krab: ... rendezvous 127.0.0.1\n", ""],
                                 [stats(5, 1), stats()], False, [], True)
    assert status == "OOM" and "preflight" not in detail, detail
    status, detail = zl.classify([137, None], ["", ""], [stats(3, 1), stats()], False, [], True)
    assert status == "OOM" and "preflight" in detail, detail  # before the launcher's line
    # Every step ran and the loss fell, then rank 0 was OOM-killed (writing the final state).
    status, detail = zl.classify([1, 0], ["krab: ... rendezvous\n", ""], [stats(2, 1), stats()],
                                 False, falling, True)
    assert status == "trained" and "after the last step" in detail, detail
    status, _ = zl.classify([1, 0], ["krab: ... rendezvous\n", ""], [stats(2, 1), stats()],
                            False, falling[:12], True)
    assert status == "OOM", status
    # Killed without the group reaching its cap: the machine's OOM killer, not a result.
    assert zl.classify([137, None], ["", ""], [stats(0, 1), stats()], False, [], True)[0] == \
        "error"
    # cli::check_job_memory's line.
    refusal = ("krab: error: parallel.zero_stage 0: a gpt of 315.5 M parameters needs about "
               "6.1 GiB per worker (--nproc-per-node 1: ...) but each has 3.0 GiB (the cgroup "
               "limit in /sys/fs/cgroup/memory/x/memory.limit_in_bytes 3.0 GiB / 1); ...")
    assert zl.classify([2, None], [refusal + "\n", ""], ok, False, [], True) == \
        ("refused", refusal)
    not_built = "krab: error: parallel.zero_stage: 3: stage 3 is not built yet (use 0, 1 or 2)"
    assert zl.classify([2, 2], [not_built, not_built], ok, False, [], True)[0] == "not built"
    assert zl.classify([None, None], ["", ""], ok, True, [], True)[0] == "timeout"
    assert zl.classify([1, None], ["krab: error: something else\n", ""], ok, False, [],
                       True)[0] == "error"


def check_start_rung():
    starts = [zl.start_rung("s0", int(c * zl.GIB)) for c in (1, 3, 5, 8)]
    assert starts == sorted(starts) and starts[0] < starts[-1], starts
    assert zl.start_rung("s3", int(5 * zl.GIB)) > zl.start_rung("s0", int(5 * zl.GIB))


def tried(layers, width, status="pass", detail="loss 5.5 -> 3.2"):
    return {"layers": layers, "width": width, "status": status, "detail": detail,
            "parameters": zl.gpt_parameters(layers, width), "rss_sampled": 2.5 * zl.GIB,
            "peak_rss": 2.1 * zl.GIB, "model_state": 1.5 * zl.GIB, "predicted": 1.9 * zl.GIB}


def check_table_round_trip():
    oom = tried(12, 1152, "OOM", "OOM-killed: worker(s) [0], oom_kill [1]")
    rows = [
        zl.row("s0", {0: tried(12, 1024), 1: oom}, 0, 1, None),
        zl.row("s2", {0: tried(16, 1280), 1: tried(16, 1408, "refused", "krab: error: ...")},
               0, 1, None),
        zl.row("s3", {0: tried(16, 1280, "not built", "stage 3 is not built yet")}, None, 0,
               "not built"),
        zl.row("ddp", {0: tried(10, 1024), 1: tried(12, 1024, "OOM", "OOM-killed")}, 0, 1, None),
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        zl.print_table(rows, int(3 * zl.GIB))
    rec = summary_records.Record({"bench": "zero_largest"}, "test",
                                 lines=out.getvalue().splitlines())
    cap, got = summary_records.zero_largest(rec)
    assert cap == 3.0, cap
    params = {run: p for run, p, _ in got}
    assert abs(params["krab stage 0"] - zl.gpt_parameters(12, 1024) / 1e6) < 0.1, got
    assert params["krab stage 3"] is None and params["PyTorch DDP (Gloo)"] is not None, got
    items = summary.items_largest(rec)
    assert [it["label"] for it in items] == ["krab stage 2 (16 x 1280)"], items
    krab, peer, ratio = summary.cells("zero-largest", [items[0]["values"]])
    s2, s0 = zl.gpt_parameters(16, 1280) / 1e6, zl.gpt_parameters(12, 1024) / 1e6
    assert ratio.startswith(f"{s2 / s0:.2f}× stage 0"), ratio
    assert peer.startswith(f"stage 0 {s0:,.0f} M; DDP"), peer


if __name__ == "__main__":
    check_parameter_count()
    check_classify()
    check_start_rung()
    check_table_round_trip()
    print("zero_largest_test: all checks hold")
