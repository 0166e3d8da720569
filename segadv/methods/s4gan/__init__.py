"""s4GAN (Mittal et al., TPAMI 2019): ``declaration.py`` says what the method needs, ``iteration.py`` runs it."""
