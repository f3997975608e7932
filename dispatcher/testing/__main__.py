"""`python -m dispatcher.testing`: the hostile MCP server over stdio (`dispatcher.testing.HostileServer`)."""

from ._hostile import main

main()
