"""Benchmarks. Importing specdraft first gives every benchmark its thread setting (`specdraft.threads`)."""

import specdraft  # noqa: F401
