"""The helpers every technique's config section is built from: the bottom layer, importing
nothing of gemref but gemref/errors.py.

Each technique's settings are a section, a small frozen dataclass that sits beside the
technique's code (`ParallelConfig` in gemref/parallel/config.py, ...) and is built from these
helpers. Every dataclass checks its fields' types (values.py) and ranges when built: a bad value
is a UsageError (a ValueError) naming the field, never a silent clamp. One module per thing:

    section.py   what the sections share (`switch` fields: flag, help, choices)
    checks.py    range and choice checks (`at_least`, `positive`, `one_of`, `require`, MAX_SEED)
    values.py    typed values: parse text by a field's type, check a value has it

What assembles a run from the sections lives in gemref/train/: TrainConfig (config.py), the
presets (presets.py), the record's config (record.py) and `override` (override.py). It sits
above every technique, so a technique importing this package never reaches the assembly that
imports it (docs/design.md, Layers). This file exports nothing: import a name from its module.
"""
