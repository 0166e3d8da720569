"""The commands: one module per console script (pyproject.toml [project.scripts]), each with its
``main``. Library code never imports from here."""
