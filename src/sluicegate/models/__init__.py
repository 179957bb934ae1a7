"""The model registry: the names a request may give as `model` (models, aliases, adapters),
what serves each (`served`), and the models file that declares them (`config`)."""
