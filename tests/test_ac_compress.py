"""The ac_compress switch end to end: its checks, the CLI, what build_model applies, the run
record, and the bytes it saves against hand arithmetic. (Training parity over seeds:
tests/test_train.py; the compression numerics: tests/test_compress.py.)"""
import pytest
import torch

from gemref.activation_compression import FORMATS
from gemref.autoac import applied_plan, saved_compression
from gemref.measure.batch_search import gemref_activation_bytes as activation_bytes
from gemref.cli import main
from gemref.autoac.config import AC_COMPRESSIONS
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.train import sample_batch, setup
from gemref.measure.run import measure_step_memory, run

TINY = get_preset("tiny")


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_the_config_knows_every_format_the_compressor_has():
    assert AC_COMPRESSIONS == ("none",) + FORMATS


@pytest.mark.parametrize("changes, message", [
    (dict(ac_compress="fp4"), "ac_compress='fp4'; valid: none, fp8_tensor, fp8_block, mxfp8"),
    (dict(ac="full", ac_compress="mxfp8"), "needs ac 'none'.*or 'auto'.*keeps only its inputs"),
    (dict(ac="memory_budget", compile=True, ac_compress="fp8_tensor"), "needs ac 'none'.*inside compiled graphs"),
])
def test_bad_settings_are_usage_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        override(TINY.train, **changes)


@pytest.mark.parametrize("args, message", [
    (["train", "--ac-compress", "fp4"], "invalid choice: 'fp4'"),
    (["train", "--set", "ac_compress=fp4"], "--set ac_compress=fp4: valid: none, fp8_tensor, fp8_block, mxfp8"),
    (["train", "--ac", "full", "--ac-compress", "mxfp8"], "ac_compress='mxfp8' needs ac 'none'"),
])
def test_cli_mistakes_exit_2_with_one_line(capsys, args, message):
    assert main(args) == 2
    assert message in one_line(capsys.readouterr().err)


def stored_bounds(fmt: str, values: int, tensors: int) -> tuple[float, float]:
    """Bytes `tensors` fp32 tensors of `values` values in all take in `fmt`, by hand: one E4M3
    byte per value, plus per tensor one fp32 scale (fp8_tensor), or per block of 32 values
    (padded up to a whole block) one fp32 scale (fp8_block) or one E8M0 byte (mxfp8)."""
    if fmt == "fp8_tensor":
        return values + 4 * tensors, values + 4 * tensors
    per_block = 32 + (4 if fmt == "fp8_block" else 1)
    low = values / 32 * per_block
    return low, low + per_block * tensors          # each tensor pads at most one block


@pytest.mark.parametrize("fmt", FORMATS)
def test_compressed_saved_activations_take_the_bytes_hand_arithmetic_says(data_root, fmt):
    plain = setup(TINY, override(TINY.train, jagged=True), device="cpu")
    comp = setup(TINY, override(TINY.train, jagged=True, ac_compress=fmt), device="cpu")
    assert applied_plan(comp.model) == {name: "compressed" for name in comp.model.checkpoint_blocks()}
    batch = sample_batch(plain)
    stats = saved_compression(comp.model).stats
    plain_bytes = activation_bytes(plain.model, batch)      # storages alive after forward (StorageBirths)
    comp_bytes = activation_bytes(comp.model, batch)
    tensors, original, stored = stats["compressed"], stats["compressed_bytes"], stats["stored_bytes"]
    assert tensors > 0
    low, high = stored_bounds(fmt, original // 4, tensors)  # fp32 on CPU: 4 bytes per value
    assert low <= stored <= high
    saved = original - stored
    # an activation another op still holds (a block's output) stays alive uncompressed too
    assert 0.5 * saved <= plain_bytes - comp_bytes <= saved
    # the step's peak (gemref/mfu/memory.py: live tensor bytes through forward + backward) drops too
    peak = {name: measure_step_memory(s, batch)["peak_memory_bytes"] for name, s in (("plain", plain), ("comp", comp))}
    assert peak["comp"] < peak["plain"], peak


def test_the_run_record_names_the_format_and_counts_per_step(data_root):
    """A plan with compressed blocks (given as ac_plan, so it is this plan whatever the timings)."""
    record = run(TINY, override(TINY.train, steps=3, warmup_steps=1, eval_batches=1, jagged=True, kernel="auto",
                                ac="auto", ac_plan="sequence:C- interaction:-- cross:-C", ac_compress="mxfp8"),
                 device="cpu", progress=False, measure_memory=False)
    assert record["config"]["train"]["activation_checkpoint"]["compress"] == "mxfp8"
    assert record["ac_plan"]["counts"] == {"compressed": 2}
    comp = record["ac_compression"]
    assert comp["format"] == "mxfp8" and comp["bytes_per_value"] == 1 + 1 / 32
    step = comp["per_step"]
    low, high = stored_bounds("mxfp8", step["compressed_bytes"] / 4, step["compressed"])
    assert step["compressed"] > 0 and low <= step["stored_bytes"] <= high
    plain = run(TINY, override(TINY.train, steps=2, warmup_steps=1, eval_batches=1), device="cpu", progress=False,
                measure_memory=False)
    assert plain["config"]["train"]["activation_checkpoint"]["compress"] == "none" and "ac_compression" not in plain


def test_compression_hooks_inside_a_compiled_function_run_eagerly():
    """saved_tensors_hooks entered inside torch.compile'd code get traced into the graph unless they
    are excluded; inductor's CPU backend has no float8_e8m0fnu (the MX scale dtype), so a
    traced mxfp8 pack failed to compile (seen in the waterfall's compiled rung 4). Compiled,
    the hooks still compress, and the gradient is the exact one (by hand: g = d/dx x sin 2x
    = sin 2x + 2x cos 2x) within what E4M3 rounding of the saved input can move it: |dx| <=
    2^-4 |x| (blocks of near-equal values) and |g'| <= 4 + 4|x|, so |error| <= (1 + |x|)^2 / 4."""
    from gemref.activation_compression import CompressionSpec, SavedCompression

    compression = SavedCompression(CompressionSpec("mxfp8"))

    @torch.compile
    def f(t):                 # the hooks entered inside the compiled code, as wrap_compressed does
        with torch.autograd.graph.saved_tensors_hooks(compression.pack, compression.unpack):
            return (torch.sin(t * 2) * t).sum()

    torch._dynamo.reset()
    x = torch.linspace(-3, 3, 512 * 256).view(512, 256).requires_grad_(True)
    f(x).backward()
    actual = x.grad.double()
    assert compression.stats["compressed"] >= 1
    assert compression.stats["stored_bytes"] < compression.stats["compressed_bytes"]
    x = torch.linspace(-3, 3, 512 * 256, dtype=torch.float64)
    exact = (torch.sin(2 * x) + 2 * x * torch.cos(2 * x)).view(512, 256)
    assert ((actual - exact).abs() <= ((1 + x.abs()) ** 2 / 4).view(512, 256)).all()
    assert (actual - exact).abs().max() > 0          # the saved values really were rounded


def test_a_softmax_model_refuses_compressed_blocks():
    """A compressed block compresses everything it saves, attention's q, k, v and O included,
    which softmax's backward amplifies (gemref/activation_compression.py): build_model says so."""
    from dataclasses import replace
    from gemref.train import build_model

    softmax = replace(TINY, model=replace(TINY.model, activation="softmax"))
    with pytest.raises(ValueError, match="softmax attention's backward amplifies"):
        build_model(softmax, override(TINY.train, jagged=True, ac_compress="mxfp8"), torch.device("cpu"))
