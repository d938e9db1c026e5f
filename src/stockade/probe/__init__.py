"""The probe: the boundary model checked against real runs of a scenario.

:mod:`stockade.probe.scenarios` holds the scenarios as data; the runner builds a
throw-away world, runs the scenario under every subset of the switchable layers and
compares each outcome with the model's prediction.
"""
