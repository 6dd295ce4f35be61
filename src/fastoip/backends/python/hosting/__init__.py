"""Worker processes' server side: the handle on one worker (its channel), its exit watch."""
