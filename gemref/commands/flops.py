"""`gemref flops`: analytic FLOPs of one training step per component; --verify counts them."""
from __future__ import annotations

import argparse

from dataclasses import replace

from ..train.presets import get_preset
from ..options import add_device_arg, device_of, output_file
from . import add_preset_arg
from .switches import add_train_switches, train_config_from_args

NAME = "flops"
HELP = "analytic FLOPs per component; --verify against FlopCounterMode"


def configure(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    add_device_arg(p)
    p.add_argument("--verify", action="store_true",
                   help="count one real training step with FlopCounterMode; exit 1 if off by > 2%%")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the report here")
    add_train_switches(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..mfu.verify import flops_report
    from ..train import sample_batch, setup
    from ..report import format_table
    from ..runtime.files import write_json

    preset = get_preset(args.preset)
    train = train_config_from_args(args, preset.train)
    replace(preset, train=train)        # the preset's checks of the config against its data
    device_of(args.device)
    s = setup(preset, train, device=args.device)
    report = flops_report(s, sample_batch(s), verify=args.verify)
    print(format_table(report["components"], title=f"FLOPs of one training step ({preset.name}, "
                       f"batch {train.batch_size}, jagged={train.attention.jagged}, kernel={report['kernel']})"))
    for line in report["summary"]:
        print(line)
    if args.json:
        write_json(args.json, report)
    return 0 if report.get("verified", True) else 1
