"""AdaptSegNet, ADVENT's AdvEnt and MinEnt: ``declaration.py`` says what the method needs, ``iteration.py`` runs it."""
