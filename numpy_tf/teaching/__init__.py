"""Teaching: the table of pure layer functions and their edge cases (layer_table.py,
layer_inputs.py), `explain` (a layer's source and derivation), `assignment` (a homework
skeleton, a .py or a notebook: notebook.py) and `grade` (a submission against numpy_tf's
functions, run in a process of its own: student_process.py; a folder into a gradebook)."""
