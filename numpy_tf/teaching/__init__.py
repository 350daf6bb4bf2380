"""Teaching: the table of pure layer functions and their edge cases (layer_table.py,
layer_inputs.py), `explain` (a layer's source and derivation), `assignment` (a homework
skeleton) and `grade` (a submission against numpy_tf's functions)."""
