"""TrainConfig's sections: each checks its own fields, the flat switch names route to them,
and records of both versions load (old flat ones too), while a bad record is refused."""
from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest

from gemref.autoac.config import AC_COMPRESSIONS, ActivationCheckpointConfig
from gemref.attention.config import KERNEL_NAMES, AttentionConfig
from gemref.train.record import RECORD_VERSION, record_version, train_as_record, train_from_record
from gemref.checkpoint.config import CheckpointConfig
from gemref.compile.config import CompileConfig
from gemref.parallel.config import EmbeddingConfig, ParallelConfig
from gemref.precision.config import PrecisionConfig
from gemref.train.config import TrainConfig, switch_values, with_switches, sections, switch_fields
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.errors import UsageError
from gemref.parallel.config import TABLE_LR

TINY = get_preset("tiny").train


def test_the_kernel_names_are_the_attention_registrys():
    from gemref.attention import kernel_names

    assert KERNEL_NAMES == kernel_names()


def test_the_compression_formats_are_autoacs():
    from gemref.activation_compression import FORMATS

    assert set(AC_COMPRESSIONS) == {"none", *FORMATS}


@pytest.mark.parametrize("section, changes, message", [
    (AttentionConfig, dict(kernel="auto"), "kernel='auto' runs on the jagged layout"),
    (AttentionConfig, dict(jagged=True, kernel="fastest"), "kernel='fastest'; valid: auto, reference"),
    (CompileConfig, dict(regions="loss"), "compile_regions='loss' is read only with compile=True"),
    (CompileConfig, dict(enabled=True, regions="loss,loss"), "give 'all' or distinct names"),
    (ActivationCheckpointConfig, dict(budget=0.0), "ac_budget must be in (0, 1]"),
    (ActivationCheckpointConfig, dict(mode="full", compress="mxfp8"), "ac_compress='mxfp8' needs ac 'none'"),
    (ActivationCheckpointConfig, dict(mode="auto", plan="sequence:X"), "ac_plan='sequence:X' must look like"),
    (ParallelConfig, dict(mesh="2by2"), "mesh='2by2' must look like RxS"),
    (ParallelConfig, dict(backend="tcp"), "backend='tcp'; valid: auto, gloo"),
    (PrecisionConfig, dict(min_dim=-1), "precision_min_dim must be >= 0, got -1"),
    (PrecisionConfig, dict(recipe="fp4"), "precision='fp4'; valid: auto, fp32"),
    (EmbeddingConfig, dict(torchrec_2d=True), "torchrec_2d is TorchRec's 2D sparse parallel"),
    (CheckpointConfig, dict(every=2), "checkpoint_every and resume need checkpoint_dir"),
    (CheckpointConfig, dict(folder="ck", every=-1), "checkpoint_every must be >= 0"),
    (CheckpointConfig, dict(folder="ck", resume=True, overwrite=True), "resume and checkpoint_overwrite contradict"),
])
def test_each_section_refuses_its_own_bad_values_by_their_switch_names(section, changes, message):
    with pytest.raises(UsageError) as e:
        section(**changes)
    assert message in str(e.value)


def test_a_section_checks_its_field_types_by_switch_name():
    with pytest.raises(UsageError, match=r"^ac_budget expects a finite number, got 'half'"):
        ActivationCheckpointConfig(mode="auto", budget="half")
    with pytest.raises(UsageError, match=r"^TrainConfig.attention expects a AttentionConfig, got"):
        TrainConfig(attention={"jagged": True})


@pytest.mark.parametrize("changes, message", [
    (dict(ac="memory_budget"), "ac='memory_budget' (PyTorch 2's activation memory budget) acts inside compiled regions"),
    (dict(checkpoint_dir="ck", checkpoint_every=400), "checkpoint_every=400 exceeds steps=300"),
    (dict(embeddings="torchrec", sparse_sharding="row"), "both shard the tables"),
    (dict(embeddings="torchrec", checkpoint_dir="ck", checkpoint_every=1), "does not save checkpoints yet"),
    (dict(embeddings="torchrec", torchrec_2d=True, mesh="1x4"), "it needs R >= 2 and S >= 2, got mesh=1x4"),
])
def test_trainconfig_keeps_the_rules_that_span_sections(changes, message):
    with pytest.raises(UsageError) as e:
        override(TINY, **changes)
    assert message in str(e.value)


def test_switches_route_to_their_sections_and_leave_the_rest():
    t = override(TINY, jagged=True, kernel="auto", ac="auto", ac_budget=0.5, balance="kk", lr=1e-3)
    assert t.attention == AttentionConfig(jagged=True, kernel="auto")
    assert t.activation_checkpoint == ActivationCheckpointConfig(mode="auto", budget=0.5)
    assert t.balancing.policy == "kk" and t.lr == 1e-3
    assert (t.compilation, t.parallelism, t.checkpoint) == (TINY.compilation, TINY.parallelism, TINY.checkpoint)
    assert t.batch_size == TINY.batch_size and TINY.attention == AttentionConfig()   # the preset is untouched


def test_a_whole_section_is_taken_and_may_not_be_mixed_with_its_switches():
    t = override(TINY, attention=AttentionConfig(jagged=True, kernel="auto"))
    assert t.attention.kernel == "auto"
    with pytest.raises(UsageError, match="the attention section is given whole and by its switches"):
        override(TINY, attention=AttentionConfig(jagged=True), kernel="auto")
    with pytest.raises(UsageError, match=r"unknown TrainConfig field\(s\) \['compile_mode'\]"):
        override(TINY, compile_mode=True)


def test_the_flat_view_names_every_switch_once_with_its_value():
    t = override(TINY, jagged=True, kernel="cpu_fused", mesh="2x1", precision="bf16")
    flat = switch_values(t)
    by_hand = {"jagged": True, "kernel": "cpu_fused", "mesh": "2x1", "precision": "bf16", "ac": "none",
               "checkpoint_dir": "", "lr": TINY.lr, "compile_regions": "all", "embeddings": "native"}
    assert {k: flat[k] for k in by_hand} == by_hand
    assert with_switches(TrainConfig(), **flat) == t            # the flat view rebuilds the config
    assert len(switch_fields()) == sum(len(fields(cls)) for cls in sections().values())


def test_a_record_round_trips_through_json_at_the_current_version():
    t = override(TINY, jagged=True, kernel="auto", ac="auto", ac_plan="sequence:SF interaction:-- cross:F-",
                 compile=True, compile_regions="interaction")
    stored = json.loads(json.dumps({"record_version": RECORD_VERSION, "config": {"train": train_as_record(t)}}))
    assert stored["config"]["train"]["activation_checkpoint"]["plan"] == "sequence:SF interaction:-- cross:F-"
    assert train_from_record(stored["config"]["train"], record_version(stored)) == t


def test_an_old_flat_record_still_loads():
    """A version-1 record (no record_version; every switch flat), as gemref wrote them before."""
    old = {"batch_size": 32, "steps": 6, "lr": 0.003, "weight_decay": 0.01, "warmup_steps": 1, "eval_every": 0,
           "eval_batches": 1, "seed": 2, "num_workers": 0, "jagged": True, "kernel": "auto", "compile": False,
           "compile_regions": "all", "ac": "auto", "ac_budget": 0.5, "ac_compress": "none", "ac_plan": "",
           "balance": "kk", "mesh": "1x2", "reshard_after_forward": True, "sparse_sharding": "row",
           "backend": "auto", "checkpoint_dir": "", "checkpoint_every": 0, "resume": False,
           "checkpoint_overwrite": False, "precision": "auto", "precision_kernel": "auto", "precision_min_dim": None,
           "embeddings": "native", "torchrec_sharding": "auto", "torchrec_2d": False}
    t = train_from_record(old, record_version({"config": {"train": old}}))
    assert (t.batch_size, t.seed, t.attention.kernel, t.activation_checkpoint.budget) == (32, 2, "auto", 0.5)
    assert (t.balancing.policy, t.parallelism.mesh, t.parallelism.sparse_sharding) == ("kk", "1x2", "row")


def test_a_version_2_record_lacks_only_the_table_optimizer_switches_added_in_3():
    stored = json.loads(json.dumps(train_as_record(TINY)))
    for key in ("table_optimizer", "table_sync_interval"):
        del stored["parallelism"][key]
    t = train_from_record(stored, 2)
    assert (t.parallelism.table_optimizer, t.parallelism.table_sync_interval) == ("adamw", 1)
    with pytest.raises(UsageError, match=r"lacks field\(s\) \['table_optimizer', 'table_sync_interval'\]"):
        train_from_record(stored, 3)


def test_a_version_3_record_lacks_table_lr_and_its_row_wise_tables_ran_at_the_dense_lr():
    for optimizer, table_lr in (("adamw", TABLE_LR), ("rowwise_adam", TINY.lr)):
        stored = json.loads(json.dumps(train_as_record(override(TINY, table_optimizer=optimizer))))
        del stored["parallelism"]["table_lr"]
        assert train_from_record(stored, 3).parallelism.table_lr == table_lr
        with pytest.raises(UsageError, match=r"lacks field\(s\) \['table_lr'\]"):
            train_from_record(stored, 4)


@pytest.mark.parametrize("record, stored, message", [
    ({"record_version": 5}, {}, "record_version 5: this gemref reads versions 1, 2, 3, 4"),
    ({"record_version": "2"}, {}, "record_version '2'"),
    ({"record_version": 2}, [], "record config.train must be an object, got list"),
    ({"record_version": 2}, {"attention": "jagged"}, "record config.train.attention must be an object"),
    ({"record_version": 2}, {"attention": {"jagged": True, "fused": True}},
     r"record config.train.attention has unknown field(s) ['fused']"),
    ({"record_version": 2}, {"jagged": True}, r"record config.train has unknown field(s) ['jagged']"),
    ({"record_version": 2}, {**train_as_record(TINY), "attention": {"jagged": "yes", "kernel": "reference"}},
     "jagged expects a boolean"),
    ({"record_version": 2}, {**train_as_record(TINY), "attention": {"jagged": True}},
     r"record config.train.attention lacks field(s) ['kernel']"),
    ({"record_version": 2}, {"attention": {"jagged": True, "kernel": "reference"}},
     r"record config.train lacks field(s) ['activation_checkpoint'"),
    ({}, {"ac_budget": 2.0, "ac": "auto"}, "ac_budget must be in (0, 1]"),
    ({}, {"flash": True}, r"unknown TrainConfig field(s) ['flash']"),
])
def test_a_bad_record_is_refused_with_a_clear_message(record, stored, message):
    with pytest.raises(UsageError) as e:
        train_from_record(stored, record_version(record))
    assert message in str(e.value)


def test_every_switch_has_help_and_its_choices_are_what_the_section_accepts():
    for flag, (name, f) in switch_fields().items():
        assert f.metadata["help"], flag
        cls = sections()[name]
        for choice in f.metadata["choices"]:        # every listed value is accepted on its own...
            try:
                cls(**{f.name: choice})
            except UsageError as e:                  # ...or refused only by a rule naming another switch
                assert f"{flag}=" in str(e) and "valid:" not in str(e), (flag, choice, str(e))


def test_a_train_record_is_the_dataclass_as_a_dict():
    t = override(TINY, jagged=True)
    assert train_as_record(t) == asdict(t) and train_as_record(t)["attention"] == {"jagged": True, "kernel": "reference"}


def test_every_committed_waterfall_record_still_loads():
    """The benchmarks/ records were written before the sections (version 1): each rung's switches load."""
    from pathlib import Path

    records = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*/waterfall.json"))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        for row in record["rungs"]:
            if "config" in row:
                t = train_from_record(row["config"]["train"], record_version(record))
                assert t.attention.jagged == row["config"]["train"].get("jagged", t.attention.jagged), path
