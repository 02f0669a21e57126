"""The benchmark implementations: their config_*.sh files (reading, picking) and fetching them from git."""
