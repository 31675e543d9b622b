"""What to report and how to fix it: one module per rule, in the wing of its family.

The kernel lives here: :mod:`base` (what a script rule is made of), :mod:`registry` (the one registry,
walking the wings, and the trigger table it generates), :mod:`situations` (what a fix's decline
protects against) and :mod:`advice` (the launch-bound and RL-loop discounts several families quote).
The wings: ``graph`` (TC1), ``amp`` (TC2), ``compile`` (TC3), ``pipeline`` (TC4), ``distributed``
(TC5), ``loop`` (TC6).
"""
