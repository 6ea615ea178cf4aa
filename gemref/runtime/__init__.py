"""What every command needs from the operating system, below every other layer.

    files.py      atomic writes (a temporary file, then a rename), JSON-able values, and
                  `private_path`: a cache folder or file is used only if it is this user's alone
    locks.py      one writer per folder (`folder_lock`, fcntl.flock), the holder named when refused
    interrupt.py  SIGINT/SIGTERM as an exception, children in their own process groups that die
                  with their parent, `kill_group`
    lazy.py       `lazy_exports`: a package whose names load on first use (its config.py alone
                  then loads nothing else)
"""
