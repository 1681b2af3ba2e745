"""One thin module per DVC stage (``python -m stages.<name>``): read its params section, call the
library, write its outs. Stages never import Prefect."""
