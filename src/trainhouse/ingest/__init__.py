"""What jobs send and leave behind, taken in, checked, kept within bounds and served back.

=====================  ========================================================================
:mod:`.groupcommit`    metric reports stored in group commits (writer threads, back-pressure)
:mod:`.spool`          the reports an SDK spooled to disk when the server did not answer
:mod:`.tensorboard`    TensorBoard event files of running jobs imported as metrics
:mod:`.checkpoints`    where checkpoints live; registering, verifying, reading, retention
:mod:`.savedmodels`    what a job saved as a model: registered, read and deleted as files
:mod:`.logretention`   the logs of jobs ended longer ago than ``--log-retention`` deleted
=====================  ========================================================================

Above the store (and beside nothing): the scheduler's loop and the use cases call these.
"""
