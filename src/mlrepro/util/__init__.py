"""Helpers every part of mlrepro uses: the subprocess runner, secrets, atomic files, process trees."""
