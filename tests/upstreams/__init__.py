"""Scripted stand-ins for upstreams unreachable in tests (OpenAI, Fireworks), and helpers to
run test servers as subprocesses. See README.md in this folder."""
