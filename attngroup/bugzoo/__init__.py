"""The bug zoo: real bugs of the attention-grouping class, each a small patch, and the
runner that proves the suite catches every one (``python -m attngroup.bugzoo``, ``nox -s bugzoo``)."""
