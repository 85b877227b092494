"""The training loss three ways: ours (seq2seq/model/loss.py), torch's
F.linear_cross_entropy, plain.

    python scripts/loss_benchmark.py [--tokens 4000] [--d-model 256 128] [--vocab 8000]
        [--smoothing 0.1 0] [--rounds 5] [--threads 2] [--device cpu] [--json FILE]

- ours: `label_smoothed_cross_entropy` (fused, chunked: 512-row chunks of logits).
- torch: `F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())`, torch's chunked
  path with its automatic chunk size and accumulation policy. Its chunked path needs
  label_smoothing == 0: with smoothing it warns and runs its reference path (full logits);
  the "path" column says which ran. Autocast does not reach its chunked op (it would run in
  fp32), so under bf16 the inputs are cast to bf16 first, as autocast casts a linear layer's.
- plain: `F.cross_entropy(hidden @ weight.T, target, label_smoothing=s, reduction="sum")`.

Each is timed for forward + backward (gradients of hidden states and the tied weight) in fp32
and under bf16 autocast. Repetitions are interleaved (ours, torch, plain, ours, ...; after
three untimed passes each: path, errors, memory) because the machine may be shared: the table
gives medians and the median of the per-round ratios of each time to ours (> 1: slower than
ours). Peak memory is what one forward + backward adds to the process: resident set size on a
CPU (free heap returned to the system first), max allocated on a GPU. Errors are against the
plain loss in float64: |loss - ref| / |ref|, and max |grad - ref| / max |ref| per gradient.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.model.loss import label_smoothed_cross_entropy

Loss = Callable[[Tensor, Tensor, Tensor, float], Tensor]


def ours(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float) -> Tensor:
    return label_smoothed_cross_entropy(hidden, weight, target, smoothing)


def torch_linear_cross_entropy(
    hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float
) -> Tensor:
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    loss = F.linear_cross_entropy(
        hidden,
        weight,
        target,
        reduction="sum",
        label_smoothing=smoothing,
        options=torch.nn.LinearCrossEntropyOptions(),
    )
    return loss.float()


def plain(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float) -> Tensor:
    return F.cross_entropy(hidden @ weight.T, target, label_smoothing=smoothing, reduction="sum")


VARIANTS: dict[str, Loss] = {"ours": ours, "torch": torch_linear_cross_entropy, "plain": plain}


def inputs(tokens: int, d_model: int, vocab: int, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """Decoder states after a layer norm, an embedding-initialised tied weight, targets."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, d_model, generator=generator)
    weight = torch.randn(vocab, d_model, generator=generator) * d_model**-0.5
    target = torch.randint(0, vocab, (tokens,), generator=generator)
    return hidden.to(device), weight.to(device), target.to(device)


def forward_backward(
    loss_fn: Loss, data: tuple[Tensor, Tensor, Tensor], smoothing: float, bf16: bool
) -> tuple[float, Tensor, Tensor]:
    hidden, weight, target = (x.detach().requires_grad_(x.is_floating_point()) for x in data)
    device = hidden.device.type
    with torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
        loss = loss_fn(hidden, weight, target, smoothing)
    loss.backward()
    return loss.item(), hidden.grad, weight.grad


def timed(loss_fn: Loss, data, smoothing: float, bf16: bool) -> float:
    synchronize(data[0].device)
    start = time.perf_counter()
    forward_backward(loss_fn, data, smoothing, bf16)
    synchronize(data[0].device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _status_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())[1])


def peak_mib(loss_fn: Loss, data, smoothing: float, bf16: bool) -> float:
    """Memory one forward + backward adds at its peak (gradients included)."""
    gc.collect()
    if data[0].device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        forward_backward(loss_fn, data, smoothing, bf16)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system: RSS is what's used
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from the current RSS
    before = _status_kib("VmRSS")
    forward_backward(loss_fn, data, smoothing, bf16)
    return (_status_kib("VmHWM") - before) / 1024


def path_taken(loss_fn: Loss, data, smoothing: float, bf16: bool) -> str:
    """'chunked' unless torch warned that it ignored its options (then its reference path)."""
    if loss_fn is not torch_linear_cross_entropy:
        return "chunked" if loss_fn is ours else "full logits"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward_backward(loss_fn, data, smoothing, bf16)
    ignored = any("options`` ignored" in str(w.message) for w in caught)
    return "full logits (options ignored)" if ignored else "chunked"


def errors(loss_fn: Loss, data, smoothing: float, bf16: bool, reference) -> dict[str, float]:
    loss, grad_hidden, grad_weight = forward_backward(loss_fn, data, smoothing, bf16)
    ref_loss, ref_hidden, ref_weight = reference

    def relative(got: Tensor, want: Tensor) -> float:
        return float((got.double() - want).abs().max() / want.abs().max())

    return {
        "loss": abs(loss - ref_loss) / abs(ref_loss),
        "grad_hidden": relative(grad_hidden, ref_hidden),
        "grad_weight": relative(grad_weight, ref_weight),
    }


def measure(args: argparse.Namespace, d_model: int, bf16: bool, smoothing: float) -> list[dict]:
    data = inputs(args.tokens, d_model, args.vocab, args.device)
    exact = tuple(x.double() if x.is_floating_point() else x for x in data)
    reference = forward_backward(plain, exact, smoothing, bf16=False)
    rows = {
        name: {
            "d_model": d_model,
            "precision": "bf16 autocast" if bf16 else "fp32",
            "smoothing": smoothing,
            "variant": name,
            "path": path_taken(fn, data, smoothing, bf16),
            "errors": errors(fn, data, smoothing, bf16, reference),
            "seconds": [],
        }
        for name, fn in VARIANTS.items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "options ignored", reported as the path
        for name, fn in VARIANTS.items():
            rows[name]["peak_mib"] = peak_mib(fn, data, smoothing, bf16)
        for _ in range(args.rounds):  # interleaved: ours, torch, plain, ours, ...
            for name, fn in VARIANTS.items():
                rows[name]["seconds"].append(timed(fn, data, smoothing, bf16))
    for row in rows.values():
        row["median_ms"] = 1000 * statistics.median(row["seconds"])
        row["time_vs_ours"] = statistics.median(
            s / ours_s for s, ours_s in zip(row["seconds"], rows["ours"]["seconds"], strict=True)
        )  # > 1: slower than ours
    return list(rows.values())


def machine(device: str) -> dict[str, str]:
    info = {"torch": torch.__version__, "threads": str(torch.get_num_threads())}
    if device == "cuda":
        info["device"] = torch.cuda.get_device_name()
        return info
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    flags = set(re.search(r"flags\s*:\s*(.*)", cpuinfo)[1].split())
    info["device"] = model[1] if model else platform.processor()
    info["bf16 flags"] = " ".join(sorted(f for f in flags if "bf16" in f)) or "none"
    return info


def table(rows: list[dict]) -> str:
    lines = [
        "| d | precision | s | variant | path | median ms | time / ours | peak MiB "
        "| loss err | grad h err | grad W err |",
        "| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        e = r["errors"]
        lines.append(
            f"| {r['d_model']} | {r['precision']} | {r['smoothing']} | {r['variant']} "
            f"| {r['path']} | {r['median_ms']:,.0f} | {r['time_vs_ours']:.2f}x "
            f"| {r['peak_mib']:,.0f} | {e['loss']:.1e} | {e['grad_hidden']:.1e} "
            f"| {e['grad_weight']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000, help="target tokens of a batch")
    parser.add_argument("--d-model", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--smoothing", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument("--rounds", type=int, default=5, help="timed repetitions of each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", type=Path, help="write machine and rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        row
        for d_model in args.d_model
        for bf16 in (False, True)
        for smoothing in args.smoothing
        for row in measure(args, d_model, bf16, smoothing)
    ]
    info = machine(args.device)
    print(", ".join(f"{k}: {v}" for k, v in info.items()))
    print(f"{args.tokens} tokens x vocabulary {args.vocab}, {args.rounds} interleaved rounds")
    print(table(rows))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
