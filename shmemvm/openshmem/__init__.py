"""openshmem"""
