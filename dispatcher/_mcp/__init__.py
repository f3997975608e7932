"""MCP servers as tool sources: sessions, connections and their registry, pins, reconnection, failures.

The one translator from server and transport failures to a call's status lives here too.
"""
