"""Reaching hosts: commands as data (command.py), results and their errors (result.py), one
Transport protocol (transport.py), SSH and local implementations (ssh.py, local.py), and a
pool of them per run (pool.py).
"""
