"""Conversion on engines: `ray` (a Ray Data datasink and reader) and `spark` (write a DataFrame); each needs its
extra, imported only here. The public modules are `varstore.ray` and `varstore.spark`.
"""
