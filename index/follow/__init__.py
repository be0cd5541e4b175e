"""Following the store from beside it: load each partition, follow the change feed, swap folders.

What the lexical and vector writers (and in-process readers) share: ``feed_follower.FeedFollower``,
and ``swap_folders`` (folders one writer replaces atomically while many processes read them:
``writer_lock``, ``new_folder``, ``swap_in``, ``current_folder``).
"""
