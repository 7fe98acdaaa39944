"""Automations: generator workers that yield requests (see engine/core/replay.py)."""
