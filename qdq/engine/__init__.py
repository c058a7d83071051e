"""The rule engine: every rule by code (`registry`), rule sets from rules/*.toml (`ruleset`), the
lint and fix drivers that walk the graph and apply what rules return, suppression comments, the
NPU exponent search on calibration data, and the summary `qdq inspect` prints.

May import: support, graph, quant, rewrite, checks.
"""
