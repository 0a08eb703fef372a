"""Per GPU and phase, the mean of nvidia-smi's loaded seconds (utilisation over 5%): utilisation, SM clock, power,
and the most frequent throttle reasons. The phase of a second is host.txt's third column there (the child engine
processes running then: 0 for one GPU's service, GPUS - 1 for all of them).

    python3 benchmarks/smi_summary.py smi.csv host.txt      (benchmarks/service_gpu_idle.sh writes both)

smi.csv: `nvidia-smi --query-gpu=timestamp,index,utilization.gpu,clocks.sm,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv,noheader -lms 1000`; host.txt: lines "epoch-seconds MHz engines load".
"""

from __future__ import annotations

import collections
import datetime
import sys


def summary(smi_lines, host_lines) -> list[str]:
    engines_at = {}
    for line in host_lines:
        f = line.split()
        if len(f) >= 3 and f[0].isdigit() and f[2].isdigit():
            engines_at[int(f[0])] = int(f[2])
    rows = collections.defaultdict(list)
    for line in smi_lines:
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7 or not f[1].isdigit():
            continue
        try:
            at = int(datetime.datetime.strptime(f[0].split(".")[0], "%Y/%m/%d %H:%M:%S")
                     .replace(tzinfo=datetime.timezone.utc).timestamp())
            util, clock, power = (float(x.split()[0]) for x in f[2:5])
        except ValueError:
            continue
        if util < 5:
            continue
        rows[(engines_at.get(at, engines_at.get(at - 1, -1)), int(f[1]))].append((util, clock, power, f[6]))
    out = []
    for (engines, gpu), r in sorted(rows.items()):
        mean = [sum(x[i] for x in r) / len(r) for i in range(3)]
        reasons = collections.Counter(x[3] for x in r).most_common(2)
        out.append(f"child engines {engines} gpu {gpu}: {len(r)} s busy, util {mean[0]:.0f}%, SM {mean[1]:.0f} MHz, "
                   f"{mean[2]:.0f} W, throttle {reasons}")
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as smi, open(sys.argv[2]) as host:
        print("\n".join(summary(smi, host)))
