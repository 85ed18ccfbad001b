"""each kernel against its reference, and its time"""
