"""agreement"""
