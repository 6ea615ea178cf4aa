"""Plotly figures shared by the notebooks and the CLI: functions take records and return figures.

    base.py    template, colours, log-axis ticks at readable values, save_figure (HTML + PNG, atomic)
    runs.py    runs and kernels: FLOPs, loss curves, step times, compile, precision, attention windows
    ladder.py  the waterfall, where each rung's step goes, a step's limits, the scale projection
    memory.py  activation checkpointing, bytes per rank, history lengths, rank loads
The names are re-exported here: `from gemref.report.figures import waterfall_figure`.
"""
from .base import (TEMPLATE, find_chromium, log_ticks, save_figure)
from .runs import (bars_figure, compile_steps_figure, flop_breakdown_figure, grouped_bars_figure,
    lines_figure, loss_curves_figure, loss_parity_figure, mx_blocks_figure, run_figure, sqnr_figure,
    time_breakdown_figure, window_figure)
from .ladder import (scale_mfu_figure, step_breakdown_figure, step_limits_figure, waterfall_breakdown_figure,
    waterfall_figure)
from .memory import (ac_fronts_figure, ac_pareto_figure, activation_profile_figure, batch_gain_figure,
    length_histogram_figure, rank_bytes_figure, rank_loads_figure)

__all__ = ["TEMPLATE", "ac_fronts_figure", "ac_pareto_figure", "activation_profile_figure", "bars_figure", "batch_gain_figure", "compile_steps_figure", "find_chromium", "flop_breakdown_figure", "grouped_bars_figure", "length_histogram_figure", "lines_figure", "log_ticks", "loss_curves_figure", "loss_parity_figure", "mx_blocks_figure", "rank_bytes_figure", "rank_loads_figure", "run_figure", "save_figure", "scale_mfu_figure", "sqnr_figure", "step_breakdown_figure", "step_limits_figure", "time_breakdown_figure", "waterfall_breakdown_figure", "waterfall_figure", "window_figure"]
