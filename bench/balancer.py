"""The `balancer` preset's table: two `kvstore serve` on one S3 store behind a real HAProxy, round-robin vs by name
(`kvstore balancer-config`), next to one server on the same kind of store.

A returning request has *moved* when another server answered it than the session's previous turn (HAProxy's
`X-KV-Server` reply header says which); `restored` there, its state came from the bucket. Times are ratios to the
one server in the same run (a shared machine: only token counts and moves are stable).
"""
from __future__ import annotations

ONE_SERVER = "1x kvstore serve, S3 store"


def table(results: dict) -> str:
    lines = []
    for model, block in results["models"].items():
        lines.append(f"\n### {model}\n")
        lines.append("| workload | target | requests | prompt tokens evaluated | ideal | x ideal | returning | moved | "
                     "restored from the bucket | TTFT p50 returning (x one server) | wall (x one server) |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        rows = block.get("workloads", [])
        base = {r["workload"]: r for r in rows if r["target"] == ONE_SERVER}
        for r in rows:
            b = base.get(r["workload"])
            rel = lambda k: f" ({r[k] / b[k]:.2f}x)" if b and b.get(k) and r.get(k) is not None else ""
            ttft = r.get("ttft_returning_p50_s")
            ret = r.get("returning") or 0
            pct = lambda n: f"{n} ({100 * n / ret:.0f}%)" if ret else str(n)
            lines.append(f"| {r['workload']} | {r['target']} | {r['requests']} | {r['prompt_n']} | {r['ideal']} | "
                         f"{r['ratio_to_ideal']} | {ret} | {pct(r.get('moved', 0))} | "
                         f"{pct(r.get('restored_from_bucket', 0))} | "
                         f"{'-' if ttft is None else f'{ttft * 1000:.0f} ms'}{rel('ttft_returning_p50_s')} | "
                         f"{r['wall_s']} s{rel('wall_s')} |")
    return "\n".join(lines)
