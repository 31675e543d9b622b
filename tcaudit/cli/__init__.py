"""The commands: ``tcaudit scan`` and the rest (:mod:`main`), ``fix`` (:mod:`fix`) and ``verify``
(:mod:`verify`). Nothing below imports this package; the front doors (``api``, the language server)
sit under it."""
