"""The project model: the modules a training script imports inside its project, read once per process
(:mod:`tcaudit.project.modules`), what a name or a call of one module stands for in another
(:mod:`tcaudit.project.symbols`) and the value a name holds where it is used
(:mod:`tcaudit.project.values`). It knows what the code is, like ``script/``, and nothing of
findings, rules or fixes; rules read a file's project through :meth:`RuleContext.project`."""
