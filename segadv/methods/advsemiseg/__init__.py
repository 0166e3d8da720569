"""AdvSemiSeg (Hung et al., BMVC 2018): ``declaration.py`` says what the method needs, ``iteration.py`` runs it."""
