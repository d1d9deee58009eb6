"""Names of the built-in arms in registry order, importable without torch (the analysis sorts by it)."""

BUILTIN_ARMS = (
    "baseline",
    "sink-logit",
    "off-by-one",
    "sink-token",
    "norm-gate",
    "proj-gate",
    "renorm",
    "combo",
    "combo2",
    "g1-elementwise",
    "g1-headwise",
    "g2-value",
)
