"""`vggserve devices`: the OpenCL platforms and devices, the spec that selects each, and set-up problems."""

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("devices", help="list OpenCL devices and diagnose OpenCL set-up problems")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime.devices import diagnose, list_devices, resolve

    devices = list_devices()
    notes = diagnose(devices)
    try:
        auto = resolve("auto").spec
    except Exception:
        auto = None
    if args.json:
        print(json.dumps({"devices": [dict(d.__dict__, spec=d.spec) for d in devices], "auto": auto,
                          "problems": notes}, indent=2))
        return 0 if auto else 3
    gpu_n = cpu_n = 0
    for d in devices:
        alias = ""
        if d.usable and d.kind == "gpu":
            alias, gpu_n = f"gpu:{gpu_n}", gpu_n + 1
        elif d.usable and d.kind == "cpu":
            alias, cpu_n = f"cpu:{cpu_n}", cpu_n + 1
        mark = "*" if d.spec == auto else " "
        state = "" if d.usable else "  UNUSABLE"
        print(f"{mark} {d.spec:5s} {alias:6s} {d.kind:4s} {d.name} | {d.platform_name} | {d.compute_units} CUs, "
              f"{d.global_mem / 2**30:.1f} GiB, local {d.local_mem // 1024} KiB, driver {d.driver_version}{state}")
    if auto:
        print("(* = what --device auto picks)")
    for n in notes:
        print(f"problem: {n}")
    return 0 if auto else 3
