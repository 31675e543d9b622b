"""tcaudit in the editor: ``tcaudit server``, a language server (tcaudit/lsp/server.py)."""
