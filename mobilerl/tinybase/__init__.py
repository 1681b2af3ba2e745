"""The tiny base model's pretraining recipe: a released artefact (``models/tiny-base/``), rebuilt on purpose.

A randomly initialised tiny model does not learn to read screens from SFT alone on a CPU, so the ``pretrain``
stage teaches it on simulator screens first:

    recipe.py   the recipe as one typed config (defaults = the released one)
    screens.py  screens snapshotted from the simulator's oracle runs, and their text
    data.py     screen-reading question/answer sequences, tokenized with their loss weights
    losses.py   the training loss (LM + attention supervision + copy readout)
    train.py    one run: tokenizer, model, training loop, in-training probe (resumable)
    probe.py    the held-out probe (teacher-forced and greedy generation)
    release.py  rebuild / release: probe, save the checkpoint and its metrics
"""

from mobilerl.tinybase.recipe import Recipe, load_recipe
from mobilerl.tinybase.release import rebuild, release_run

__all__ = ["Recipe", "load_recipe", "rebuild", "release_run"]
