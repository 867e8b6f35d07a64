"""``python -m bench``: every benchmark in one run; each prints ratios measured in that run."""

from __future__ import annotations

import platform
import time

from bench import bisect_sim, decode_throughput, nixl_bandwidth


def main() -> None:
    print(f"# bench {time.strftime('%Y-%m-%d')} on {platform.machine()} "
          f"{platform.processor() or ''} ({__import__('os').cpu_count()} cores)")
    print("\n## decode throughput")
    decode_throughput.main(["--tokens", "32"])
    print("\n## NIXL KV transfer vs memcpy")
    nixl_bandwidth.main([])
    print("\n## bisection: Bayesian vs fixed-repeat")
    bisect_sim.main(["--quick"])


if __name__ == "__main__":
    main()
