"""A module whose attribute the programs of ``test_user_programs_round4.py`` set."""

FLAG = 0
