"""Looking inside the Transformer: the attention maps of a forward pass, and pictures (drawn
with matplotlib, an optional extra: pip install 'numpy-tf[plot]').

    attention.py    attention_maps, format_attention, plot_attention (per layer and head)
    runs.py         read_history, plot_loss (train and held out), plot_norms (per block)
    positions.py    plot_sinusoidal (the table), plot_rope (both layouts)
    activations.py  plot_activations (GELU, SiLU and their derivatives)
    gradients.py    plot_gradcheck (a GradcheckReport, one row per tensor)
    figure.py       the shared figure, saving to .png or .svg, token labels

Every plot_* returns a matplotlib Figure and saves it when given path=.
"""
from .activations import plot_activations
from .attention import attention_maps, format_attention, plot_attention
from .gradients import plot_gradcheck
from .positions import plot_rope, plot_sinusoidal
from .runs import plot_loss, plot_norms, read_history
