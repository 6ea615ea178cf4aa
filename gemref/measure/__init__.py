"""Measurements that build and step the composed model (`train.build_model`) to compare one
technique's variants: what the `gemref bench` commands print and the chapters plot. One module
per comparison; each sits here, above the training composition, because it trains in order to
measure (docs/design.md, layer 8). The pure parts (partition policies, byte counts, timing of a
single layer) stay in their technique's package."""
