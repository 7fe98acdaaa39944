"""Automations: generator workers that yield requests (see engine/replay.py)."""
