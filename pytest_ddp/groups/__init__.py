"""The controller's rank groups: starts, commands, watches and stops ranks; runs one test under the watchdog.

Imports config, diagnose, common, and only the entry point of rank.
"""
