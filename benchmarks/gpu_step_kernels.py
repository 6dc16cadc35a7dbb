"""`benchmarks/gpu_step_check.py --measure`: the kernels it times and how (torch only, no autotune:
it runs on a GPU host by itself). See gpu_step_check.py for what is measured."""

from __future__ import annotations

import time
from typing import Any

from gpu_step_clock import Clock, rate, us  # beside this script

GEMM_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
LM_HEAD_ROWS = [1, 8, 32, 128, 256, 512, 1024, 2048, 4096]
PREFILL_M = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
DECODE_BC = [(b, c) for c in (512, 2048) for b in (1, 8, 32, 128, 256)] + [(b, 8192) for b in (1, 8, 32)]
QUICK = dict(gemm_m=[1, 4, 64], lm_rows=[1, 16], prefill_m=[64, 128], decode_bc=[(2, 64), (4, 128)])


def per_rank(shape: dict[str, int]) -> dict[str, int]:
    """The shapes one tensor-parallel rank multiplies through."""
    tp = shape["tp"]
    heads, kv_heads = shape["heads"] // tp, max(1, shape["kv_heads"] // tp)
    d = shape["head_dim"]
    return dict(
        hidden=shape["hidden"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=d,
        q_dim=heads * d,
        kv_dim=kv_heads * d,
        inter=shape["inter"] // tp,
        vocab=shape["vocab"] // tp,
    )


class Measurer:
    def __init__(self, torch: Any, device: str, quick: bool) -> None:
        import torch.nn.functional as F  # noqa: N812
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch, self.F, self.device = torch, F, device
        self.sdpa_kernel = sdpa_kernel
        self.backends = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
        }
        self.dtype = torch.bfloat16
        self.clock = Clock(torch, device)
        grid = QUICK if quick else {}
        self.gemm_m = grid.get("gemm_m", GEMM_M)
        self.lm_rows = grid.get("lm_rows", LM_HEAD_ROWS)
        self.prefill_m = grid.get("prefill_m", PREFILL_M)
        self.decode_bc = grid.get("decode_bc", DECODE_BC)

    def randn(self, *shape: int, scale: float = 1.0) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype) * scale

    # -- attention ------------------------------------------------------------------------------------

    def _sdpa(self, backend: str, q: Any, k: Any, v: Any, causal: bool, gqa: str) -> Any:
        """SDPA on one backend; gqa 'native' passes enable_gqa, 'expand' repeats K/V per query head."""
        if gqa == "expand" and k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        with self.sdpa_kernel([self.backends[backend]]):
            return self.F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=(gqa == "native" and k.shape[1] != q.shape[1])
            )

    def _usable(self, backend: str, q: Any, k: Any, v: Any, causal: bool) -> str | None:
        """The GQA mode this backend runs these shapes with ('native' first), or None."""
        for gqa in ("native", "expand"):
            try:
                self._sdpa(backend, q, k, v, causal, gqa)
                self.clock.sync()
                return gqa
            except RuntimeError:
                continue
        return None

    def attention(self, q: Any, k: Any, v: Any, causal: bool) -> tuple[dict[str, Any], str | None, str]:
        """Seconds per backend (None where it refuses), the fastest backend and its GQA mode.

        With the 'expand' mode the repeated K/V are made outside the timed region (kernel time only)."""
        times: dict[str, Any] = {}
        modes: dict[str, str] = {}
        for name in self.backends:
            gqa = self._usable(name, q, k, v, causal)
            if gqa is None:
                times[name] = None
                continue
            kk, vv = k, v
            if gqa == "expand" and k.shape[1] != q.shape[1]:
                group = q.shape[1] // k.shape[1]
                kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

            def body(mark: Any, name: str = name, kk: Any = kk, vv: Any = vv, gqa: str = gqa) -> None:
                mark()
                self._sdpa(name, q, kk, vv, causal, gqa)
                mark()

            times[name] = self.clock.measure(body)["median"]
            modes[name] = gqa
            del kk, vv
        usable = {n: t for n, t in times.items() if t is not None}
        best = min(usable, key=usable.__getitem__) if usable else None
        return times, best, modes.get(best or "", "none")

    # -- a decoder layer --------------------------------------------------------------------------------

    def layer_weights(self, r: dict[str, int]) -> dict[str, Any]:
        h = r["hidden"]
        return {
            "qkv": self.randn(r["q_dim"] + 2 * r["kv_dim"], h, scale=0.02),
            "o": self.randn(h, r["q_dim"], scale=0.02),
            "gate_up": self.randn(2 * r["inter"], h, scale=0.02),
            "down": self.randn(h, r["inter"], scale=0.02),
            "ln1": self.torch.ones(h, device=self.device, dtype=self.dtype),
            "ln2": self.torch.ones(h, device=self.device, dtype=self.dtype),
        }

    def rope_tables(self, positions: Any, d: int) -> tuple[Any, Any]:
        torch = self.torch
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))
        ang = positions.to(torch.float32)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def rope(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rotated = x.new_empty(x.shape)
        rotated[..., :half] = -x[..., half:]
        rotated[..., half:] = x[..., :half]
        return x * cos + rotated * sin

    def layer_forward(self, x: Any, w: dict[str, Any], r: dict[str, int], attend: Any, rope: Any) -> Any:
        """One pre-norm decoder layer; attend(q, k, v) takes (tokens, heads, d) rotated q and k."""
        F = self.F  # noqa: N806
        hid, d = r["hidden"], r["head_dim"]
        h = F.rms_norm(x, (hid,), w["ln1"], 1e-6)
        q, k, v = F.linear(h, w["qkv"]).split([r["q_dim"], r["kv_dim"], r["kv_dim"]], dim=-1)
        q = self.rope(q.view(-1, r["heads"], d), *rope)
        k = self.rope(k.view(-1, r["kv_heads"], d), *rope)
        a = attend(q, k, v.view(-1, r["kv_heads"], d))
        x = x + F.linear(a, w["o"])
        h = F.rms_norm(x, (hid,), w["ln2"], 1e-6)
        gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w["down"])

    def layer_time(self, layer_body: Any, best: str, gqa: str) -> tuple[float | None, str | None]:
        """Microseconds of the whole layer with the fastest attention backend (the others, and the other
        GQA mode, where it refuses the layer's strided q/k/v), and the backend and mode used."""
        combos = [(best, gqa)] + [
            (b, g) for b in self.backends for g in ("native", "expand") if (b, g) != (best, gqa)
        ]
        for backend, mode in combos:
            try:
                layer_body(lambda: None, backend, mode)
                self.clock.sync()
            except RuntimeError:
                continue
            res = self.clock.measure(lambda mark, b=backend, g=mode: layer_body(mark, b, g))
            return us(res["median"]), f"{backend}/{mode}"
        return None, None

    # -- one model --------------------------------------------------------------------------------------

    def model(self, name: str, shape: dict[str, int], deadline: float) -> dict[str, Any]:
        torch, F = self.torch, self.F  # noqa: N806
        r = per_rank(shape)
        out: dict[str, Any] = {"shape": shape, "per_rank": r}
        w = self.layer_weights(r)
        hid, qd, inter = r["hidden"], r["q_dim"], r["inter"]
        nq, nkv, d = r["heads"], r["kv_heads"], r["head_dim"]

        # (a) the layer's four linear GEMMs, back to back, each timed
        gemm = []
        for m in self.gemm_m:
            if time.monotonic() > deadline:
                out["truncated"] = True
                break
            xh, xq, xi = self.randn(m, hid), self.randn(m, qd), self.randn(m, inter)

            def body(mark: Any, xh: Any = xh, xq: Any = xq, xi: Any = xi) -> None:
                mark()
                F.linear(xh, w["qkv"])
                mark()
                F.linear(xq, w["o"])
                mark()
                F.linear(xh, w["gate_up"])
                mark()
                F.linear(xi, w["down"])
                mark()

            res = self.clock.measure(body)
            row: dict[str, Any] = {"m": m}
            flops = bytes_ = 0
            for (part, _x, wt), t in zip(
                (
                    ("qkv", xh, w["qkv"]),
                    ("o", xq, w["o"]),
                    ("gate_up", xh, w["gate_up"]),
                    ("down", xi, w["down"]),
                ),
                res["segments"],
                strict=True,
            ):
                n_out, k_in = wt.shape
                row[f"{part}_us"] = us(t)
                flops += 2 * m * n_out * k_in
                bytes_ += 2 * (n_out * k_in + m * k_in + m * n_out)
            total = sum(res["segments"])
            row.update(total_us=us(total), tflops=rate(flops, total, 1e12), gbps=rate(bytes_, total, 1e9))
            row["weight_gbps"] = rate(
                2 * sum(w[p].numel() for p in ("qkv", "o", "gate_up", "down")), total, 1e9
            )
            gemm.append(row)
            print(
                f"  gemm M={m:6d}: {row['total_us']:10.1f} us  {row['tflops']:6.1f} TFLOP/s  "
                f"{row['gbps']:7.1f} GB/s"
            )
            del xh, xq, xi
        out["gemm"] = gemm

        # (c) lm_head at the sampled rows
        lm = self.randn(r["vocab"], hid, scale=0.02)
        lm_rows = []
        for rows in self.lm_rows:
            if time.monotonic() > deadline:
                out["truncated"] = True
                break
            x = self.randn(rows, hid)

            def lm_body(mark: Any, x: Any = x) -> None:
                mark()
                F.linear(x, lm)
                mark()

            t = self.clock.measure(lm_body)["median"]
            flops, bytes_ = (
                2 * rows * r["vocab"] * hid,
                2 * (r["vocab"] * hid + rows * hid + rows * r["vocab"]),
            )
            lm_rows.append(
                {"rows": rows, "us": us(t), "tflops": rate(flops, t, 1e12), "gbps": rate(bytes_, t, 1e9)}
            )
            print(f"  lm_head rows={rows:5d}: {us(t):9.1f} us")
            del x
        out["lm_head"] = lm_rows

        # (b) prefill: attention alone (per backend) and the whole layer with the fastest backend
        prefill = []
        for m in self.prefill_m:
            if time.monotonic() > deadline:
                out["truncated"] = True
                break
            q, k, v = self.randn(1, nq, m, d), self.randn(1, nkv, m, d), self.randn(1, nkv, m, d)
            times, best, gqa = self.attention(q, k, v, causal=True)
            del q, k, v
            pairs = m * (m + 1) / 2
            row = {"m": m, "attn_us": {n: us(t) for n, t in times.items()}, "best": best, "gqa": gqa}
            if best is not None:
                row["attn_tflops"] = rate(4 * nq * d * pairs, times[best], 1e12)
                x = self.randn(m, hid)
                rope = self.rope_tables(torch.arange(m, device=self.device), d)

                def layer_body(mark: Any, backend: str, gqa: str, x: Any = x, rope: Any = rope) -> None:
                    def attend(qt: Any, kt: Any, vt: Any, backend: str = backend, gqa: str = gqa) -> Any:
                        qh, kh, vh = (t.transpose(0, 1)[None] for t in (qt, kt, vt))
                        o = self._sdpa(backend, qh, kh, vh, True, gqa)
                        return o[0].transpose(0, 1).reshape(qt.shape[0], -1)

                    mark()
                    self.layer_forward(x, w, r, attend, rope)
                    mark()

                row["layer_us"], row["layer_attn"] = self.layer_time(layer_body, best, gqa)
                del x, rope
            prefill.append(row)
            print(
                f"  prefill M={m:6d}: attn {row['attn_us']} best {best}/{gqa}  layer {row.get('layer_us')} us"
            )
        out["prefill"] = prefill

        # (b) decode: B one-token queries against C cached tokens each; the query heads of one KV head
        # are that head's queries (B, kv_heads, group, d), so the KV is read once, as a paged kernel does
        decode = []
        group = nq // nkv
        for b, c in self.decode_bc:
            if time.monotonic() > deadline:
                out["truncated"] = True
                break
            kc, vc = self.randn(b, nkv, c, d), self.randn(b, nkv, c, d)
            q = self.randn(b, nkv, group, d)
            times, best, gqa = self.attention(q, kc, vc, causal=False)
            del q
            kv_bytes = 2 * b * nkv * c * d * 2
            row = {"b": b, "c": c, "attn_us": {n: us(t) for n, t in times.items()}, "best": best}
            if best is not None:
                row["kv_gbps"] = rate(kv_bytes, times[best], 1e9)
                x = self.randn(b, hid)
                rope = self.rope_tables(torch.full((b,), c, device=self.device), d)

                def layer_body(
                    mark: Any,
                    backend: str,
                    _gqa: str,
                    x: Any = x,
                    rope: Any = rope,
                    kc: Any = kc,
                    vc: Any = vc,
                    nb: int = b,
                    nc: int = c,
                ) -> None:
                    def attend(qt: Any, kt: Any, vt: Any) -> Any:
                        # write this step's K/V into the cache (vLLM's cache write), then attend
                        kc[:, :, nc - 1].copy_(kt)
                        vc[:, :, nc - 1].copy_(vt)
                        o = self._sdpa(backend, qt.view(nb, nkv, group, d), kc, vc, False, "native")
                        return o.reshape(nb, -1)

                    mark()
                    self.layer_forward(x, w, r, attend, rope)
                    mark()

                row["layer_us"], row["layer_attn"] = self.layer_time(layer_body, best, "native")
                del x, rope
            del kc, vc
            decode.append(row)
            print(
                f"  decode B={b:4d} C={c:5d}: attn {row['attn_us']} best {best}  "
                f"layer {row.get('layer_us')} us"
            )
        out["decode"] = decode
        if self.clock.cuda:
            out["max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        return out
