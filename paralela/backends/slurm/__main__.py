"""``python -m paralela.backends.slurm JOBDIR [TASK]``: run one array task (see ``_worker``)."""

from paralela.backends.slurm._worker import main

main()
