"""Benchmark helpers: peers (other frameworks) and cost-growth plots."""
