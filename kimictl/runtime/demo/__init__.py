"""`kimictl demo`: `run` serves, tunes, A/Bs and stops on the CPU runtime; `tune` holds the
measured tune's candidates and choice rule. Import from those modules."""
